//! Logging for every command: `tracing` events, filtered by `IDEM_LOG` (parsed strictly,
//! `filter.rs`), formatted by `tracing_subscriber` and written to stderr through a bounded,
//! lossy queue (`sink.rs`), so a dead or stalled log reader never blocks or panics a request.
//!
//! Lines that never reached stderr are counted ([`dropped`]); `idem serve` exports the counts
//! as `idem_log_write_failures_total` and `idem_log_lines_dropped_total`.

mod filter;
mod sink;

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::time::Duration;

pub(crate) use sink::Dropped;
use sink::Sink;
use tracing_subscriber::EnvFilter;

/// The variable holding the log filter.
pub(crate) const ENV: &str = "IDEM_LOG";

/// Test hook: the queue's bound in bytes instead of `sink::QUEUE_BYTES`.
const TEST_QUEUE_BYTES_ENV: &str = "IDEM_TEST_LOG_QUEUE_BYTES";

/// How long the exit waits for queued lines to reach stderr.
const DRAIN: Duration = Duration::from_secs(1);

/// The process's sink, once [`init`] ran.
static SINK: OnceLock<Sink> = OnceLock::new();

/// The filter from `IDEM_LOG` (unset or blank: `default`), without installing anything: a
/// bad filter is refused before a command does any work.
///
/// # Errors
/// One line naming the directive `IDEM_LOG` got wrong, or saying it is not UTF-8.
pub(crate) fn filter(default: &str) -> Result<EnvFilter, String> {
    match std::env::var(ENV) {
        Ok(spec) if !spec.trim().is_empty() => filter::parse(&spec),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(EnvFilter::new(default)),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!("{ENV}: {v:?} is not UTF-8")),
    }
}

/// Installs the process's subscriber: `filter`'s events to stderr through the sink.
///
/// # Errors
/// The sink's thread cannot be started, or a subscriber is already installed.
pub(crate) fn init(filter: EnvFilter) -> Result<(), String> {
    // Test hook: a small queue, so a test overflows it with a few hundred lines.
    let capacity = std::env::var(TEST_QUEUE_BYTES_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(sink::QUEUE_BYTES);
    let sink = Sink::start(std::io::stderr(), capacity)
        .map_err(|e| format!("cannot start the log thread: {e}"))?;
    let _ = SINK.set(sink.clone());
    tracing_subscriber::fmt()
        .with_writer(sink)
        // Colour codes only for a person at a terminal, never in a log file or a pipe.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter)
        // Its report of a failed write is an `eprintln!`: a panic on a closed stderr. The
        // sink never fails a write; it counts its own failures.
        .log_internal_errors(false)
        .try_init()
        .map_err(|e| format!("cannot install the log subscriber: {e}"))
}

/// Queues one line (with its newline) behind the log lines, if the sink runs; false when it
/// does not, and the caller writes to stderr itself.
pub(crate) fn line(bytes: &[u8]) -> bool {
    match SINK.get() {
        Some(sink) => {
            sink.push(bytes);
            true
        }
        None => false,
    }
}

/// Lines that never reached stderr since start.
pub(crate) fn dropped() -> Dropped {
    SINK.get().map(Sink::dropped).unwrap_or_default()
}

/// Lets queued lines reach stderr before the process exits, for a second at most.
pub(crate) fn finish() {
    if let Some(sink) = SINK.get() {
        sink.drain(DRAIN);
    }
}
