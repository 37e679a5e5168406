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
//! - Unauthenticated: an example bound to loopback by default, whose tenant is the path's
//!   org. Put it behind your own authentication, or embed `idem_org::http` in your service
//!   with the tenant taken from your authentication (`examples/axum_service.rs`).
//! - SIGTERM / Ctrl-C: stop accepting, finish in-flight requests, release every org (final
//!   ship + Release entry, so a successor claims at once), exit 0.
//!
//! The request path goes through `idem-org` alone (its `Registry`, its `http` layer, and the
//! idem and replica types it re-exports): `routes.rs` is a few routes over the layer,
//! `ledger.rs` the application each request runs, `metrics.rs` the exporter.
//!
//! Test hook: when `IDEM_TEST_HOLD_DIR` is set, a request whose key starts with `hold-` writes
//! `<dir>/<key>.held` once it is registered in flight and inside its transaction, then waits
//! until `<dir>/<key>.go` exists before applying. Tests use it to make the 409 case deterministic.

pub(crate) mod ledger;
mod metrics;
mod routes;

pub(crate) use metrics::Metrics;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::Args;
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
    /// After SIGTERM: how long open connections may take to finish (a slow or half-sent
    /// body, an idle keep-alive) before every org is released anyway and the process exits 0.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    drain_timeout: Duration,
}

/// The writer id: `--writer`, else `idem-serve-<id of the data directory>`.
/// `--lease-ms`: a number of ms of at least [`replica::MIN_LEASE_MS`]; anything shorter is
/// refused before the store is touched (renewals every third of it would not keep up).
///
/// # Errors
/// Not a number, or below the minimum: the message clap prints.
pub(crate) fn lease_ms_arg(s: &str) -> Result<u64, String> {
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
    let writer = writer_id(&a)?;
    let store = crate::store::parse(&a.store)?;
    let settings = replica::Settings {
        lease_ms: a.lease_ms,
        advertise: a.advertise.clone(),
        ..replica::Settings::default()
    };
    let replica = store.open(settings).await?;
    let registry = Registry::builder(&a.data, replica, writer.clone())
        .settings(idem_org::Settings {
            force_claim: a.force_claim,
            ..idem_org::Settings::default()
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
    let app = routes::router(registry.clone(), metrics);
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", a.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    // The first stdout line is the contract with `idem demo` and the tests.
    println!("listening on http://{addr}");
    tracing::info!(%addr, writer = %writer, "serving");
    let pruner = a
        .prune_every
        .map(|every| tokio::spawn(prune_loop(registry.clone(), every, a.prune_older_than)));
    let (stopped_tx, mut stopped) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        stop_signal().await;
        let _ = stopped_tx.send(true);
    });
    // A client that sent half a body, or idles on a keep-alive connection, must not keep
    // this process (and its leases) alive: after the drain timeout every org is released
    // anyway and the process exits; the requests still open were never acknowledged.
    let drain = a.drain_timeout;
    let deadline = async move {
        let _ = stopped.wait_for(|s| *s).await;
        tokio::time::sleep(drain).await;
    };
    tokio::select! {
        served = server.into_future() => served.map_err(|e| format!("server failed: {e}"))?,
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

async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stop signal: draining, then releasing every org");
}

async fn prune_loop(registry: Registry, every: Duration, older_than: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let cutoff = SystemTime::now()
            .checked_sub(older_than)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        for (org, result) in registry.prune_all(cutoff, |_| {}).await {
            match result {
                Ok(n) => tracing::info!(org = %org, deleted = n, "pruned"),
                Err(e) => tracing::warn!(org = %org, error = %crate::chain(&e), "prune failed"),
            }
        }
    }
}
