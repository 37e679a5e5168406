//! The HTTP routes: the ledger's `POST` through `idem_org::http` (the Idempotency-Key
//! layer: 400/409/422, replay, errors by kind), its `GET` through the writer or the store.
//!
//! `idem serve` is an unauthenticated example bound to loopback by default: the tenant is
//! the path's org. A service exposed to clients takes the tenant from its authentication
//! instead (`examples/axum_service.rs`), never from the path alone.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem_org::http::{
    Idempotency, IdempotentRequest, Refusal, StoredResponse, error_response, json_error,
    json_fallbacks,
};
use idem_org::replica::OrgId;
use idem_org::{ReadSource, Registry};

use crate::ledger::{self, ApplyError, Transfer};

/// The routes of `idem serve` over `registry`.
pub(super) fn router(
    registry: Registry,
    metrics: Option<super::Metrics>,
    forwarding: Option<idem_org::http::Forwarding>,
) -> Router {
    // The fingerprint is the transfer's canonical form, so a retry that reformats the JSON
    // is the same request; a body that does not parse is refused before the layer.
    let effects = super::effects::router(registry.clone());
    let gauges = registry.clone();
    let mut idem = Idempotency::new(registry).fingerprint(|req| {
        serde_json::from_slice::<Transfer>(req.body())
            .map(|t| t.fingerprint())
            .unwrap_or_else(|_| req.body().to_vec())
    });
    if let Some(f) = forwarding {
        idem = idem.forwarding(f);
    }
    let state = Arc::new(AppState {
        idem,
        hold: std::env::var_os("IDEM_TEST_HOLD_DIR").map(PathBuf::from),
    });
    let mut router = Router::new()
        .route("/orgs/{org}/transfers", post(transfer))
        .route("/orgs/{org}/balances", get(balances))
        .route("/healthz", get(|| async { "ok" }));
    if let Some(m) = metrics {
        // Gauges judged at the scrape (open effects: a lapsed reservation counts ambiguous).
        let render = move || {
            gauges.record_effect_gauges();
            std::future::ready(m.render())
        };
        router = router.route("/metrics", get(render));
    }
    json_fallbacks(router.with_state(state).merge(effects))
}

struct AppState {
    idem: Idempotency,
    hold: Option<PathBuf>,
}

/// The path's org id (as sent, and validated). A path that does not decode (bad
/// percent-encoding) is bad input like an invalid id, answered in the JSON error shape.
fn org_of(path: Result<Path<String>, PathRejection>) -> Result<(String, OrgId), String> {
    let Path(org) = path.map_err(|e| e.body_text())?;
    let id = OrgId::new(&org).map_err(|e| e.to_string())?;
    Ok((org, id))
}

async fn transfer(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    req: IdempotentRequest,
) -> Response {
    let refuse = |why: String| {
        idem_org::metrics::record_request("input");
        json_error(StatusCode::BAD_REQUEST, "input", why)
    };
    let org = match org_of(path) {
        Ok((_, id)) => id,
        Err(e) => return refuse(e),
    };
    // Validated before the layer: a malformed transfer is bad input, not a failed attempt.
    let t: Transfer = match serde_json::from_slice(req.body()) {
        Ok(t) => t,
        Err(e) => return refuse(format!("bad body: {e}")),
    };
    if let Err(e) = t.validate() {
        return refuse(e);
    }
    let hold = st.hold.clone();
    st.idem
        .run(&org, req, move |tx, req| {
            if let Some(dir) = &hold {
                hold_until_go(dir, req.key());
            }
            let receipt = t.apply(req.key(), tx).map_err(|e| match e {
                ApplyError::Pruned(_) => Refusal::new(StatusCode::CONFLICT, e.to_string()),
                ApplyError::Sqlite(e) => Refusal::internal(e),
            })?;
            Ok(StoredResponse::new(StatusCode::CREATED, receipt).header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ))
        })
        .await
}

/// Test hook (`IDEM_TEST_HOLD_DIR`): a `hold-*` key, already registered in flight and inside
/// its transaction, marks `<dir>/<key>.held` and waits for `<dir>/<key>.go` (30 s at most).
/// It blocks the org's writer thread, which is what a slow handler does too.
fn hold_until_go(dir: &std::path::Path, key: &str) {
    let safe = key.starts_with("hold-")
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !safe {
        return;
    }
    let _ = std::fs::write(dir.join(format!("{key}.held")), b"");
    let go = dir.join(format!("{key}.go"));
    let waited = idem_base::Stopwatch::start();
    while !go.exists() && waited.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

async fn balances(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let (org, id) = match org_of(path) {
        Ok(both) => both,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, "input", e),
    };
    // This replica's own writer answers from its database, once confirmed (I6, I7): no
    // download. An org it does not hold is read from the store's newest published state,
    // never claimed for a read (that would fence the writer that holds it), and a tenant
    // never written reads as empty with nothing created in the store (`Registry::read`).
    let read = match st.idem.registry().read(&id, ledger::balances).await {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let balances = balances_json(read.value);
    let body = match read.source {
        ReadSource::Writer { round } => serde_json::json!({
            "org": org, "source": "writer", "round": round, "balances": balances,
        }),
        ReadSource::Store { seq, .. } => serde_json::json!({
            "org": org, "source": "store", "snapshot_seq": seq, "balances": balances,
        }),
        _ => serde_json::json!({
            "org": org, "source": "store", "snapshot_seq": null, "balances": balances,
        }),
    };
    axum::Json(body).into_response()
}

/// Balances as a JSON object, account id → cents.
fn balances_json(rows: Vec<(String, i64)>) -> serde_json::Map<String, serde_json::Value> {
    rows.into_iter().map(|(k, v)| (k, v.into())).collect()
}
