//! The HTTP routes: each request becomes one `idem-org` call, each org error one status.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem_org::http::idempotency_key;
use idem_org::replica::OrgId;
use idem_org::{ErrorKind, Registry, idem};

use super::ledger::{self, Transfer};

/// The routes of `idem serve` over `registry`.
pub(super) fn router(registry: Registry) -> Router {
    let state = Arc::new(AppState {
        registry,
        inflight: Mutex::new(HashSet::new()),
        hold: std::env::var_os("IDEM_TEST_HOLD_DIR").map(PathBuf::from),
    });
    Router::new()
        .route("/orgs/{org}/transfers", post(transfer))
        .route("/orgs/{org}/balances", get(balances))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
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

fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into(), "kind": kind });
    let mut resp = (status, axum::Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
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
    // The IETF header rules, then idem's key rules (`idem::validate_key`): one parser, org's.
    let key = match idempotency_key(&headers) {
        Ok(k) => k,
        Err(why) => return error(StatusCode::BAD_REQUEST, "input", why),
    };
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
    let restored = match crate::store::restored::restore(st.registry.replica(), &id, None).await {
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
