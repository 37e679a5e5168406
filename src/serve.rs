//! `idem serve`: the ledger over HTTP, with `Idempotency-Key` semantics of the IETF draft.
//!
//! - `POST /orgs/{org}/transfers` with `Idempotency-Key` and `{"from","to","cents"}`:
//!   201 + receipt once shipped (ack); a replay returns the stored receipt with
//!   `Idempotent-Replayed: true`; missing key or bad body → 400; same key, other payload →
//!   422; same key while its first request is still in flight here → 409; store unavailable,
//!   lease held by another writer or fenced → 503 with `Retry-After` (retry, same key).
//! - `GET /orgs/{org}/balances`: balances in the newest published (acknowledged) snapshot.
//! - SIGTERM / Ctrl-C: stop accepting, finish in-flight requests, release every org (final
//!   ship + Release entry, so a successor claims at once), exit 0.
//!
//! Test hook: when `IDEM_TEST_HOLD_DIR` is set, a request whose key starts with `hold-` writes
//! `<dir>/<key>.held` once it is registered in flight, then waits until `<dir>/<key>.go`
//! exists before applying. Tests use it to make the 409 case deterministic.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem_org::{ErrorKind, Registry};
use idem_replica::OrgId;

use crate::ledger::{self, Transfer};

/// Options of `idem serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Store URL.
    pub store: String,
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: String,
    /// Local data directory for org databases.
    pub data: PathBuf,
    /// Writer id recorded in claims.
    pub writer: String,
    /// Advisory lease length.
    pub lease_ms: u64,
    /// Claim orgs even when another writer's lease is live.
    pub force_claim: bool,
    /// Run the pruner this often, if set.
    pub prune_every: Option<Duration>,
    /// Pruner deletes keys older than this.
    pub prune_older_than: Duration,
    /// After SIGTERM, how long open connections may take to finish before every org is
    /// released anyway.
    pub drain_timeout: Duration,
}

struct AppState {
    registry: Registry,
    inflight: Mutex<HashSet<(String, String)>>,
    hold: Option<PathBuf>,
}

/// Removes a key from the in-flight set when its request ends, however it ends.
struct InFlight<'a>(&'a AppState, (String, String));
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(&self.0.inflight).remove(&self.1);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs the server until SIGTERM or Ctrl-C, then releases every org.
///
/// # Errors
/// Bad store URL, store probe failure, bind failure: one line.
pub async fn run(cfg: ServeConfig) -> Result<(), String> {
    if cfg.prune_every.is_some_and(|every| every.is_zero()) {
        return Err("--prune-every must be longer than 0s".into());
    }
    let store = crate::store_url::parse(&cfg.store)?;
    let settings = idem_replica::Settings {
        lease_ms: cfg.lease_ms,
        ..idem_replica::Settings::default()
    };
    let replica = store.open(settings).await?;
    let registry = Registry::builder(&cfg.data, replica, cfg.writer.clone())
        .settings(idem_org::Settings {
            force_claim: cfg.force_claim,
            ..idem_org::Settings::default()
        })
        .on_open(ledger::init)
        .build()
        .map_err(|e| crate::chain(&e))?;
    let state = Arc::new(AppState {
        registry: registry.clone(),
        inflight: Mutex::new(HashSet::new()),
        hold: std::env::var_os("IDEM_TEST_HOLD_DIR").map(PathBuf::from),
    });
    let app = Router::new()
        .route("/orgs/{org}/transfers", post(transfer))
        .route("/orgs/{org}/balances", get(balances))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(&cfg.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the bound address: {e}"))?;
    // The first stdout line is the contract with `idem demo` and the tests.
    println!("listening on http://{addr}");
    tracing::info!(%addr, writer = %cfg.writer, "serving");
    let pruner = cfg
        .prune_every
        .map(|every| tokio::spawn(prune_loop(registry.clone(), every, cfg.prune_older_than)));
    let (stopped_tx, mut stopped) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        stop_signal().await;
        let _ = stopped_tx.send(true);
    });
    // A client that sent half a body, or idles on a keep-alive connection, must not keep
    // this process (and its leases) alive: after the drain timeout every org is released
    // anyway and the process exits; the requests still open were never acknowledged.
    let drain = cfg.drain_timeout;
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

fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into(), "kind": kind });
    let mut resp = (status, axum::Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// The `Idempotency-Key` of a request (IETF draft: one Structured Field item, a string).
///
/// Exactly one field with one value: a second field, or a value that is a list (`k, k`), is
/// refused, so one logical request can never run under two keys. The key is 1–255 visible
/// ASCII characters (0x21–0x7E); it may be sent as an sf-string (`"abc"` is the key `abc`,
/// with `\"` and `\\` escapes) or bare, as most clients do. Anything else — a space, a TAB
/// or another control byte — is refused.
///
/// # Errors
/// Why the header is refused, for a 400.
fn idempotency_key(headers: &HeaderMap) -> Result<String, String> {
    let mut fields = headers.get_all("idempotency-key").iter();
    let (Some(value), None) = (fields.next(), fields.next()) else {
        return Err(if headers.contains_key("idempotency-key") {
            "Idempotency-Key must be sent once".into()
        } else {
            "missing Idempotency-Key header".into()
        });
    };
    let raw = value.as_bytes().trim_ascii();
    let visible = |b: &u8| (0x21..=0x7e).contains(b);
    let key = match raw.strip_prefix(b"\"") {
        Some(rest) => {
            let mut key = Vec::new();
            let mut bytes = rest.iter();
            loop {
                match bytes.next() {
                    Some(b'"') => break,
                    Some(b'\\') => match bytes.next() {
                        Some(&c @ (b'"' | b'\\')) => key.push(c),
                        _ => return Err("Idempotency-Key has a bad escape".into()),
                    },
                    Some(&c) if visible(&c) => key.push(c),
                    Some(_) => return Err("Idempotency-Key must be visible ASCII".into()),
                    None => return Err("Idempotency-Key has an unterminated string".into()),
                }
            }
            if bytes.next().is_some() {
                return Err("Idempotency-Key must hold one value".into());
            }
            key
        }
        None if raw.contains(&b',') => return Err("Idempotency-Key must hold one value".into()),
        None if raw.iter().all(visible) => raw.to_vec(),
        None => return Err("Idempotency-Key must be visible ASCII".into()),
    };
    String::from_utf8(key).map_err(|_| "Idempotency-Key must be visible ASCII".into())
}

async fn transfer(
    State(st): State<Arc<AppState>>,
    Path(org): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    // A body refused by the extractor (too large: 413) gets the same JSON error shape.
    let body = match body {
        Ok(b) => b,
        Err(rejection) => {
            return error(rejection.status(), "input", rejection.body_text());
        }
    };
    let org_id = match OrgId::new(&org) {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, "input", e.to_string()),
    };
    let key = match idempotency_key(&headers) {
        Ok(k) => k,
        Err(why) => return error(StatusCode::BAD_REQUEST, "input", why),
    };
    if let Err(e) = idem::validate_key(&key) {
        return error(StatusCode::BAD_REQUEST, "input", e.to_string());
    }
    let t: Transfer = match serde_json::from_slice(&body) {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, "input", format!("bad body: {e}")),
    };
    if let Err(e) = t.validate() {
        return error(StatusCode::BAD_REQUEST, "input", e);
    }
    let id = (org.clone(), key.clone());
    if !lock(&st.inflight).insert(id.clone()) {
        return error(
            StatusCode::CONFLICT,
            "conflict",
            format!("a request with idempotency key {key:?} is still in flight"),
        );
    }
    let _guard = InFlight(&st, id);
    if let Some(dir) = &st.hold {
        hold(dir, &key).await;
    }
    let opts = idem::Options::new().fingerprint(t.fingerprint());
    let k = key.clone();
    let result = st
        .registry
        .once_with(&org_id, &key, opts, move |tx| t.apply(&k, tx))
        .await;
    match result {
        Ok(out) => {
            let mut resp = (StatusCode::CREATED, out.result).into_response();
            let h = resp.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            if !out.applied {
                h.insert("idempotent-replayed", HeaderValue::from_static("true"));
            }
            resp
        }
        Err(e) => org_error(&e),
    }
}

fn org_error(e: &idem_org::Error) -> Response {
    let msg = crate::chain(e);
    if e.is_fingerprint_mismatch() {
        return error(StatusCode::UNPROCESSABLE_ENTITY, "mismatch", msg);
    }
    let fenced = matches!(e, idem_org::Error::Fenced { .. });
    match e.kind() {
        ErrorKind::Retry => error(StatusCode::SERVICE_UNAVAILABLE, "retry", msg),
        ErrorKind::Reacquire if fenced => error(StatusCode::SERVICE_UNAVAILABLE, "fenced", msg),
        ErrorKind::Reacquire => error(StatusCode::SERVICE_UNAVAILABLE, "reacquire", msg),
        ErrorKind::Input => error(StatusCode::BAD_REQUEST, "input", msg),
        ErrorKind::Rejected => error(StatusCode::UNPROCESSABLE_ENTITY, "rejected", msg),
        ErrorKind::Corrupt => error(StatusCode::INTERNAL_SERVER_ERROR, "corrupt", msg),
        _ => error(StatusCode::INTERNAL_SERVER_ERROR, "fatal", msg),
    }
}

async fn hold(dir: &std::path::Path, key: &str) {
    let safe = key.starts_with("hold-")
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !safe {
        return;
    }
    let _ = std::fs::write(dir.join(format!("{key}.held")), b"");
    let go = dir.join(format!("{key}.go"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !go.exists() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn balances(State(st): State<Arc<AppState>>, Path(org): Path<String>) -> Response {
    let id = match OrgId::new(&org) {
        Ok(id) => id,
        Err(e) => return error(StatusCode::BAD_REQUEST, "input", e.to_string()),
    };
    // This replica's own writer answers from its database, once confirmed (I6, I7): no
    // download. An org it does not hold is read from the store's newest published state
    // (never claimed for a read: that would fence the writer that holds it).
    if let Some(handle) = st.registry.serving(&id) {
        match handle.read(ledger::balances).await {
            Ok(rows) => {
                return axum::Json(serde_json::json!({
                    "org": org, "source": "writer", "round": handle.round(),
                    "balances": balances_json(rows),
                }))
                .into_response();
            }
            Err(e) => {
                tracing::debug!(org = %id, error = %crate::chain(&e), "balances from the store instead")
            }
        }
    }
    let restored = match crate::restored::restore(st.registry.replica(), &id, None).await {
        Ok(r) => r,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, "retry", e),
    };
    let (seq, rows) = match &restored {
        None => (None, Vec::new()),
        Some(r) => {
            let rows = r
                .open()
                .and_then(|c| ledger::balances(&c).map_err(|e| e.to_string()));
            match rows {
                Ok(rows) => (r.hydrated.snapshot.as_ref().map(|s| s.seq), rows),
                Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "fatal", e),
            }
        }
    };
    axum::Json(serde_json::json!({
        "org": org, "source": "store", "snapshot_seq": seq, "balances": balances_json(rows),
    }))
    .into_response()
}

/// Balances as a JSON object, account id → cents.
fn balances_json(rows: Vec<(String, i64)>) -> serde_json::Map<String, serde_json::Value> {
    rows.into_iter().map(|(k, v)| (k, v.into())).collect()
}
