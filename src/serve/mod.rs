//! `idem serve`: the ledger over HTTP, with `Idempotency-Key` semantics of the IETF draft.
//!
//! - `POST /orgs/{org}/transfers` with `Idempotency-Key` and `{"from","to","cents"}`:
//!   201 + receipt once shipped (ack); a replay returns the stored receipt with
//!   `Idempotent-Replayed: true`; missing key or bad body → 400; same key, other payload →
//!   422; same key while its first request is still in flight here, or a retry of a key
//!   pruned long ago → 409; store unavailable, lease held by another writer or fenced → 503
//!   with `Retry-After` (retry, same key). All of it is `idem_org::http`'s layer.
//! - `GET /orgs/{org}/balances`: balances in the newest published (acknowledged) snapshot.
//! - `GET /metrics`: Prometheus text format (`idem_org::metrics` lists the names).
//! - `POST /orgs/{org}/effects/{key}/resolve`: an operator resolves an AMBIGUOUS effect of an
//!   org this server holds, through its own writer (`effects.rs`; `idem resolve --via`).
//! - Unauthenticated: an example bound to loopback by default, whose tenant is the path's
//!   org. Put it behind your own authentication, or embed `idem_org::http` in your service
//!   with the tenant taken from your authentication (`examples/axum_service.rs`).
//! - SIGTERM, SIGHUP (the terminal or SSH session that started it closed) or Ctrl-C: stop
//!   accepting, finish in-flight requests, release every org (final ship + Release entry, so
//!   a successor claims at once), exit 0. Only SIGKILL ends it without a release.
//! - Every error body, a 404 or 405 included, is the JSON shape `{"error", "kind"}`.
//! - Limits (`http.rs`): `--header-read-timeout` closes a connection that is slow to send a
//!   request head or idles between requests; `--max-connections` bounds open connections.
//! - Logs never block a request (`crate::log`): `/metrics` counts the lines stderr lost.
//!
//! The request path goes through `idem-org` alone (its `Registry`, its `http` layer, and the
//! idem and replica types it re-exports): `routes.rs` is a few routes over the layer,
//! `ledger.rs` the application each request runs, `metrics.rs` the exporter, `http.rs` the
//! HTTP/1.1 server under the routes (hyper, with the limits axum's `serve` lacks).
//!
//! Test hook: when `IDEM_TEST_HOLD_DIR` is set, a request whose key starts with `hold-` writes
//! `<dir>/<key>.held` once it is registered in flight and inside its transaction, then waits
//! until `<dir>/<key>.go` exists before applying. Tests use it to make the 409 case deterministic.
//! `IDEM_TEST_LOG_QUEUE_BYTES` (every command, `crate::log`) bounds the log queue, so a test
//! overflows it with a few hundred lines.

mod effects;
mod http;
mod metrics;
mod routes;

pub(crate) use metrics::Metrics;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::ledger;
use idem_org::{Registry, replica};

/// `idem serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Store URL: a path, file://, memory://, s3://bucket/prefix, gs://, az://.
    #[arg(long)]
    store: String,
    /// Address to listen on; port 0 picks a free port (printed on stdout). Loopback by
    /// default: `idem serve` is unauthenticated (the tenant is the path's org), so expose it
    /// only behind your own authentication.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Local data directory for org databases (a cache; the store is the authority).
    #[arg(long, default_value = "idem-data")]
    data: PathBuf,
    /// Writer id recorded in claims and leases (default: `idem-serve-<id of --data>`, an id
    /// kept in DATA/home.id, so a restart on the same data directory keeps it). Each process
    /// also has its own instance, so two live processes with one id never take orgs from
    /// each other; a restart that finds the data directory's lock free (the old process is
    /// gone) claims its orgs at once instead of waiting out their leases.
    #[arg(long)]
    writer: Option<String>,
    /// Run the in-process pruner this often (e.g. 1h).
    #[arg(long, value_parser = humantime::parse_duration)]
    prune_every: Option<Duration>,
    /// With --prune-every: delete keys applied longer ago than this.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "7d")]
    prune_older_than: Duration,
    /// Refuse to prune keys or retire snapshots by age (logged, counted in
    /// `idem_clock_refusals_total`) while this host's clock and the store's disagree by more
    /// than this; the store's is read from the Last-Modified of this process's own writes.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    max_clock_skew: Duration,
    /// Advisory lease length in ms: another replica claims the orgs of a writer that died
    /// without releasing them once it has seen its lease unrenewed this long plus a tenth, on
    /// its own monotonic clock (SIGTERM releases at once). At least 1000.
    #[arg(long, default_value_t = 30_000, value_parser = lease_ms_arg)]
    lease_ms: u64,
    /// Where clients reach this server (e.g. http://10.0.0.7:8080), written into the leases
    /// it holds: another replica refused by one of its orgs answers 503 naming it as
    /// `"holder"`, so a client retries there instead of waiting.
    #[arg(long)]
    advertise: Option<String>,
    /// Claim orgs even when another writer's lease is live, fencing that writer (operator
    /// override, e.g. when a host is known dead).
    #[arg(long)]
    force_claim: bool,
    /// After SIGTERM or SIGHUP: how long open connections may take to finish (a slow or
    /// half-sent body) before every org is released anyway and the process exits 0.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    drain_timeout: Duration,
    /// Close a connection that has not sent a whole request head this long after it
    /// connected or after its last response (half a header, no byte, an idle keep-alive).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    header_read_timeout: Duration,
    /// Connections open at once, at most; more wait in the listen backlog until one closes.
    /// The default leaves half of the descriptors the registry reserves for the rest of the
    /// process (1024) to store connections, temporary files and logs.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Ships of one org in flight at once, 1 to 8 (`docs/design.md` 3e): above 1 a busy
    /// org's next ship leaves before the previous one has landed, and requests are still
    /// acknowledged in order, each once its ship and every earlier one landed. The entries
    /// such a writer creates are read only by this version and newer, so raise it once no
    /// older replica reads the store.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=replica::MAX_SHIP_WINDOW))]
    ship_window: u64,
    /// Ship every org of this process in one journal run (`docs/design.md` 3g): one store
    /// PUT acknowledges every org that committed while the previous one was in flight, a
    /// crashed process's orgs are taken by one adopt seal. Orgs a per-org holder still holds
    /// stay per org. Stores holding journal orgs are read only by this version and newer,
    /// and a replica started without `--journal` refuses those orgs. Not with
    /// `--force-claim`.
    #[arg(long, conflicts_with = "force_claim")]
    journal: bool,
    /// Forward a request for an org another live replica holds to the address it advertised
    /// (`--advertise`), and relay its answer, instead of answering 503 with that address: any
    /// replica behind a load balancer then answers. The holder still runs the request; a
    /// forward that gets no answer within --forward-timeout is the 503.
    #[arg(long)]
    forward: bool,
    /// With --forward: how long a forwarded request may take in all.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    forward_timeout: Duration,
}

/// The writer id: `--writer`, else `idem-serve-<id of the data directory>`.
/// `--lease-ms`: a number of ms of at least [`replica::MIN_LEASE_MS`]; anything shorter is
/// refused before the store is touched (renewals every third of it would not keep up).
///
/// # Errors
/// Not a number, or below the minimum: the message clap prints.
pub fn lease_ms_arg(s: &str) -> Result<u64, String> {
    let ms: u64 = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number of ms: {e}"))?;
    if ms < replica::MIN_LEASE_MS {
        return Err(format!(
            "{ms} ms is shorter than the minimum lease, {} ms",
            replica::MIN_LEASE_MS
        ));
    }
    Ok(ms)
}

fn writer_id(a: &ServeArgs) -> Result<String, String> {
    if let Some(w) = &a.writer {
        return Ok(w.clone());
    }
    std::fs::create_dir_all(&a.data)
        .map_err(|e| format!("cannot create data directory {}: {e}", a.data.display()))?;
    let id = idem_org::home_id(&a.data)
        .map_err(|e| format!("cannot read the id of {}: {e}", a.data.display()))?;
    Ok(format!("idem-serve-{id}"))
}

/// Runs the server until SIGTERM or Ctrl-C, then releases every org.
///
/// # Errors
/// Bad store URL, store probe failure, bind failure: one line.
pub async fn run(a: ServeArgs) -> Result<(), String> {
    if a.prune_every.is_some_and(|every| every.is_zero()) {
        return Err("--prune-every must be longer than 0s".into());
    }
    if a.header_read_timeout.is_zero() {
        return Err("--header-read-timeout must be longer than 0s".into());
    }
    let stop = stop_signal()?;
    let writer = writer_id(&a)?;
    let store = crate::store::parse(&a.store)?;
    let settings = replica::Settings {
        lease_ms: a.lease_ms,
        advertise: a.advertise.clone(),
        max_clock_skew_ms: u64::try_from(a.max_clock_skew.as_millis()).unwrap_or(u64::MAX),
        ship_window: a.ship_window,
        ..replica::Settings::default()
    };
    let replica = crate::store::open(&store, settings).await?;
    let registry = Registry::builder(&a.data, replica, writer.clone())
        .settings(idem_org::RegistrySettings {
            force_claim: a.force_claim,
            // Claims in the background what a draining or dead process held, so a request
            // finds its org open; never with a forced claim, which would take orgs from live
            // holders.
            warm: idem_org::WarmSettings {
                enabled: !a.force_claim,
                ..idem_org::WarmSettings::default()
            },
            journal: idem_org::JournalSettings {
                enabled: a.journal,
                ..idem_org::JournalSettings::default()
            },
            ..idem_org::RegistrySettings::default()
        })
        .on_open(ledger::init)
        .build()
        .map_err(|e| crate::chain(&e))?;
    let metrics = match Metrics::install() {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(error = %e, "serving without /metrics");
            None
        }
    };
    let forwarding = if a.forward {
        // One hop: the holder's own address is current while its lease is.
        Some(
            idem_org::http::Forwarding::new(a.forward_timeout, 1)
                .map_err(|e| format!("cannot build the forwarding client: {e}"))?,
        )
    } else {
        None
    };
    let app = routes::router(registry.clone(), metrics, forwarding);
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", a.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    // The first stdout line is the contract with `idem-demo` and the tests.
    outln!("listening on http://{addr}");
    tracing::info!(%addr, writer = %writer, "serving");
    let pruner = a
        .prune_every
        .map(|every| tokio::spawn(prune_loop(registry.clone(), every, a.prune_older_than)));
    let (stopped_tx, mut stopped) = tokio::sync::watch::channel(false);
    let limits = http::Limits {
        header_read_timeout: a.header_read_timeout,
        max_connections: a.max_connections,
    };
    let server = http::serve(listener, app, limits, async move {
        stop.await;
        let _ = stopped_tx.send(true);
    });
    // A client that sent half a body must not keep this process (and its leases) alive:
    // after the drain timeout every org is released anyway and the process exits; the
    // requests still open were never acknowledged.
    let drain = a.drain_timeout;
    let deadline = async move {
        let _ = stopped.wait_for(|s| *s).await;
        tokio::time::sleep(drain).await;
    };
    tokio::select! {
        () = server => {}
        () = deadline => tracing::warn!(
            drain_ms = drain.as_millis() as u64,
            "drain timeout: releasing every org with connections still open"
        ),
    }
    if let Some(p) = pruner {
        p.abort();
    }
    for (org, result) in registry.shutdown().await {
        match result {
            Ok(()) => tracing::info!(org = %org, "released"),
            Err(e) => tracing::warn!(org = %org, error = %crate::chain(&e), "release failed"),
        }
    }
    Ok(())
}

/// Installs the stop signals' handlers now and returns a future that completes at the first
/// SIGTERM, SIGHUP or Ctrl-C. Installed before the address is printed, so a signal sent as
/// soon as the server is reachable is never met by its default action (exit, no release).
/// SIGHUP is a stop like SIGTERM: a server started from an SSH session gets it when the
/// session closes.
///
/// # Errors
/// A handler cannot be installed.
fn stop_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{SignalKind, signal};
    let install = |kind: SignalKind, name: &str| {
        signal(kind).map_err(|e| format!("cannot handle {name}: {e}"))
    };
    let mut term = install(SignalKind::terminate(), "SIGTERM")?;
    let mut hup = install(SignalKind::hangup(), "SIGHUP")?;
    let mut int = install(SignalKind::interrupt(), "SIGINT")?;
    Ok(async move {
        let which = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = hup.recv() => "SIGHUP",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(
            signal = which,
            "stop signal: draining, then releasing every org"
        );
    })
}

async fn prune_loop(registry: Registry, every: Duration, older_than: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        // Each org computes its cutoff after its own clock check (`Org::prune`): a cutoff
        // read here, before the check, would survive a host clock stepping back mid-run.
        let results = registry.prune_all(older_than, |_| {}).await;
        // A clock refusal is the host's, not each org's: one line per run names it.
        let refused: Vec<_> = results
            .iter()
            .filter(|(_, r)| r.as_ref().is_err_and(idem_org::Error::is_clock_skew))
            .collect();
        if let Some((_, Err(e))) = refused.first() {
            tracing::warn!(orgs = refused.len(), error = %crate::chain(e), "prune refused: nothing deleted");
        }
        for (org, result) in &results {
            match result {
                Ok(n) => tracing::info!(org = %org, deleted = n, "pruned"),
                Err(e) if e.is_clock_skew() => {}
                Err(e) => tracing::warn!(org = %org, error = %crate::chain(e), "prune failed"),
            }
        }
    }
}
