//! `GET /metrics`: the Prometheus text format of everything `idem-org` and `idem-replica`
//! record (names in `idem_org::metrics`), through the `metrics` facade's Prometheus exporter.

use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// The installed recorder, rendered per scrape.
#[derive(Clone)]
pub(crate) struct Metrics(PrometheusHandle);

/// Buckets of every `_seconds` histogram: 1 ms to 10 s.
const SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

impl Metrics {
    /// Installs the process-wide recorder and describes every metric.
    ///
    /// # Errors
    /// A recorder is already installed in this process.
    pub(crate) fn install() -> Result<Metrics, String> {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)
            .map_err(|e| format!("metrics buckets: {e}"))?
            .install_recorder()
            .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
        idem_org::metrics::describe();
        describe();
        let upkeep = handle.clone();
        // Histograms drain their buffers on upkeep; a scrape also runs it.
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                upkeep.run_upkeep();
            }
        });
        Ok(Metrics(handle))
    }

    /// The text exposition format.
    pub(crate) fn render(&self) -> String {
        // The log sink counts on its own (it runs before any recorder, in every command);
        // a scrape copies its counts.
        let dropped = crate::log::dropped();
        metrics::counter!(LOG_WRITE_FAILURES).absolute(dropped.write_failures);
        metrics::counter!(LOG_LINES_DROPPED).absolute(dropped.queue_full);
        self.0.render()
    }
}

/// Log lines whose write to stderr failed (the reader is gone): dropped, never retried.
const LOG_WRITE_FAILURES: &str = "idem_log_write_failures_total";
/// Log lines dropped because the queue in front of stderr was full (the reader stalled).
const LOG_LINES_DROPPED: &str = "idem_log_lines_dropped_total";

/// Describes the metrics of `idem serve` itself (the libraries describe theirs).
fn describe() {
    use super::http::{ACCEPT_ERRORS, CONNECTIONS, HEADER_TIMEOUTS};
    metrics::describe_counter!(
        LOG_WRITE_FAILURES,
        "log lines dropped because their write to stderr failed"
    );
    metrics::describe_counter!(
        LOG_LINES_DROPPED,
        "log lines dropped because the queue in front of stderr was full"
    );
    metrics::describe_gauge!(CONNECTIONS, "HTTP connections open");
    metrics::describe_counter!(ACCEPT_ERRORS, "failed accepts of HTTP connections");
    metrics::describe_counter!(
        HEADER_TIMEOUTS,
        "HTTP connections closed for not sending a request head within the header-read timeout"
    );
}
