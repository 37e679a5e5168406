//! `POST /orgs/{org}/effects/{key}/resolve`: the resolve the holder performs itself, so an
//! operator settles an AMBIGUOUS effect (a lapsed reservation included) without claiming the
//! org, which would fence this server (`idem resolve --via`).
//!
//! Body: `{"outcome": "executed", "result": "<text>", "by": "<who>"}` or
//! `{"outcome": "not_executed", "by": "<who>"}`. Answers 200 `{"org", "effect"}` as
//! `Org::resolve` wrote it (shipped); 421 `{"error", "kind": "not_served", "holder"}` when
//! this process does not serve the org (never claimed for this: the holder, when its lease
//! names an address, is in `holder`); 400 for a bad body; the layer's table for the rest
//! (`idem_org::http`: a live reservation is 503 `retry`, a row that is not ambiguous 400).
//! Like every route of `idem serve`, unauthenticated: put it behind your own.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem_org::Registry;
use idem_org::http::{error_response, json_error};
use idem_org::idem::effect::Resolution;
use idem_org::replica::OrgId;
use serde::Deserialize;

/// The route, over the registry whose writers resolve.
pub(super) fn router(registry: Registry) -> Router {
    Router::new()
        .route("/orgs/{org}/effects/{key}/resolve", post(resolve))
        .with_state(registry)
}

/// The request body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResolveBody {
    outcome: String,
    result: Option<String>,
    by: String,
}

async fn resolve(
    State(registry): State<Registry>,
    Path((org, key)): Path<(String, String)>,
    body: Result<Json<ResolveBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let bad = |why: String| json_error(StatusCode::BAD_REQUEST, "input", why);
    let id = match OrgId::new(&org) {
        Ok(id) => id,
        Err(e) => return bad(e.to_string()),
    };
    let Json(body) = match body {
        Ok(b) => b,
        Err(e) => return bad(format!("bad body: {e}")),
    };
    let resolution = match (body.outcome.as_str(), body.result) {
        ("executed", Some(r)) => Resolution::Executed(r.into_bytes()),
        ("executed", None) => return bad("\"executed\" needs a \"result\"".into()),
        ("not_executed", None) => Resolution::NotExecuted,
        ("not_executed", Some(_)) => return bad("\"not_executed\" takes no \"result\"".into()),
        (other, _) => {
            return bad(format!(
                "unknown outcome {other:?}: \"executed\" or \"not_executed\""
            ));
        }
    };
    let Some(handle) = registry.serving(&id) else {
        let holder = match registry.replica().lease(&id).await {
            Ok(Some(lease)) => lease.addr,
            _ => None,
        };
        let body = serde_json::json!({
            "error": format!("org {id} is not served by this process: resolve through its holder"),
            "kind": "not_served",
            "holder": holder,
        });
        return (StatusCode::MISDIRECTED_REQUEST, Json(body)).into_response();
    };
    match handle.resolve(&key, resolution, &body.by).await {
        Ok(row) => Json(serde_json::json!({
            "org": id.as_str(),
            "effect": crate::ops::effect_json(&row, &row),
        }))
        .into_response(),
        Err(e) => error_response(&e),
    }
}
