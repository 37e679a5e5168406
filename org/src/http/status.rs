//! Every failure as an HTTP answer, in one table ([`error_response`]), with one JSON shape:
//! `{"error": "<message>", "kind": "<kind>"}`. A 500 never carries the failure's text: its
//! message is generic with an error id, and the log line (`tracing::error!`) with that id
//! holds the text.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::{Error, ErrorKind};

/// The message of every 500 answer, followed by its error id: what failed is for the
/// operator's log, never for the client (a database error names tables and columns).
pub const INTERNAL_MESSAGE: &str = "internal error";

/// An answer the handler gives without storing it: its transaction rolls back, the attempt
/// is counted, and a retry under the same key runs the handler again. For answers that must
/// replay (a declined payment), return a [`super::StoredResponse`] with that status instead.
///
/// `?` on a `rusqlite::Error` or `std::io::Error` inside a handler makes a
/// [`Refusal::internal`]: a 500 whose body says only [`INTERNAL_MESSAGE`] and an error id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {}", detail.as_deref().unwrap_or(message))]
pub struct Refusal {
    status: StatusCode,
    kind: String,
    message: String,
    /// The failure's own text (internal refusals): logged with the error id, never sent.
    detail: Option<String>,
}

impl Refusal {
    /// A refusal with `status` and a message for the JSON body (`kind` is `refused`).
    pub fn new(status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            kind: "refused".into(),
            message: message.into(),
            detail: None,
        }
    }

    /// A 500 (kind `internal`) for a failure of the handler's own work (an SQL error): the
    /// client gets [`INTERNAL_MESSAGE`] and an error id, the log (`tracing::error!`, field
    /// `error_id`) gets the id and `e`'s text.
    pub fn internal(e: impl std::fmt::Display) -> Refusal {
        Refusal {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "internal".into(),
            message: INTERNAL_MESSAGE.into(),
            detail: Some(e.to_string()),
        }
    }

    /// The status it answers with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The `kind` of its JSON body: `refused` or `internal`.
    pub fn kind(&self) -> &str {
        &self.kind
    }
}

impl From<rusqlite::Error> for Refusal {
    /// [`Refusal::internal`]: an SQL failure is the handler's, never the client's to read.
    fn from(e: rusqlite::Error) -> Refusal {
        Refusal::internal(idem_base::ErrorChain::new(&e))
    }
}

impl From<std::io::Error> for Refusal {
    /// [`Refusal::internal`].
    fn from(e: std::io::Error) -> Refusal {
        Refusal::internal(idem_base::ErrorChain::new(&e))
    }
}

/// A short id for one internal error: 12 hex digits, random (a process counter where the
/// random source fails), unique enough to find its one log line.
fn error_id() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut b = [0u8; 6];
    match getrandom::fill(&mut b) {
        Ok(()) => hex::encode(b),
        Err(_) => format!(
            "c{:011x}",
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ),
    }
}

/// A 500 answer of `kind`: the body is `{"error": "internal error (id ID)", "kind": kind,
/// "error_id": ID}`; `detail` (the failure's whole text) goes to the log with the id only.
pub(crate) fn internal_response(kind: &str, detail: &str) -> Response {
    let id = error_id();
    tracing::error!(error_id = %id, kind, error = %detail, "answered 500");
    let body = serde_json::json!({
        "error": format!("{INTERNAL_MESSAGE} (id {id})"), "kind": kind, "error_id": id,
    });
    (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response()
}

/// The layer's JSON error answer, `{"error": message, "kind": kind}`, with `Retry-After: 1`
/// on a 503: for an application's own errors around the layer, in the same shape.
pub fn json_error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into(), "kind": kind });
    let mut resp = (status, axum::Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// The answer for an org error, by this table (the layer's own answers included); every body
/// is `{"error": message, "kind": kind}`:
///
/// | failure | status | kind |
/// |---|---|---|
/// | no, a listed or a malformed `Idempotency-Key`; an unreadable body ([`super::IdempotentRequest`]) | 400 | `input` |
/// | a body over the router's limit | 413 | `input` |
/// | the same key still in flight on this replica ([`super::Idempotency::run`]) | 409 | `in_flight` |
/// | another payload under an applied key (I4) | 422 | `mismatch` |
/// | the handler's [`Refusal::new`] (not stored) | the refusal's | `refused` |
/// | the handler's [`Refusal::internal`], or `?` on a `rusqlite::Error` / `std::io::Error` | 500 | `internal` |
/// | the handler failed otherwise, panicked, or its response is too large to store | 500 | `handler_failed` |
/// | every attempt the key allows failed | 422 | `attempts_exhausted` |
/// | other rejections (an effect in the wrong state) | 409 | `rejected` |
/// | `Retry` (ship failed, store down, lease held elsewhere, busy) | 503 + `Retry-After` | `retry` |
/// | `Reacquire`: fenced by a newer round | 503 + `Retry-After: 1` | `fenced` |
/// | `Reacquire`: closed, claim lost, poisoned (the next request re-acquires) | 503 + `Retry-After: 1` | `reacquire` |
/// | `Input` (bad org id, invalid settings) | 400 | `input` |
/// | `Corrupt` (stored data damaged; a stored response that does not decode) | 500 | `corrupt` |
/// | `Fatal` (unsafe store, host clock contradicted) | 500 | `fatal` |
/// | unknown path, wrong method, undecodable path ([`super::json_fallbacks`]) | 404, 405, 400 | `input` |
///
/// Every 500 (`internal`, `handler_failed`, `corrupt`, `fatal`) says only
/// `"internal error (id ID)"`, with `"error_id": ID` beside: its text (an SQL error names
/// tables and columns) goes to the log, one `tracing::error!` line with the field
/// `error_id = ID` and the whole cause chain; install a tracing subscriber to see it. Other
/// answers name their cause. `Retry-After` is 1 second, or for an org another writer's
/// lease holds, the seconds (rounded up) this replica still has to see that lease unchanged
/// before it may claim, with `"holder": <its address>` when the holder advertised one.
pub fn error_response(e: &Error) -> Response {
    if let Some(addr) = e.holder_addr() {
        let body = serde_json::json!({ "error": idem_base::ErrorChain::new(e).to_string(), "kind": "retry", "holder": addr });
        // A held lease always knows its end: `with_retry_after` sets the header.
        let resp = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
        return with_retry_after(resp, e);
    }
    with_retry_after(table_response(e), e)
}

/// Sets `Retry-After` to the held lease's remaining watch in seconds, when the error knows it.
fn with_retry_after(mut resp: Response, e: &Error) -> Response {
    if let Some(wait) = e.retry_after()
        && resp.status() == StatusCode::SERVICE_UNAVAILABLE
    {
        let secs = wait.as_millis().div_ceil(1000).to_string();
        if let Ok(v) = HeaderValue::from_str(&secs) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    resp
}

fn table_response(e: &Error) -> Response {
    let msg = idem_base::ErrorChain::new(e).to_string();
    if e.is_fingerprint_mismatch() {
        return json_error(StatusCode::UNPROCESSABLE_ENTITY, "mismatch", msg);
    }
    match e.idem() {
        Some(idem::Error::Apply { source, .. }) => {
            return match source.downcast_ref::<Refusal>() {
                Some(refusal) if refusal.detail.is_some() => internal_response(&refusal.kind, &msg),
                Some(refusal) => json_error(refusal.status, &refusal.kind, refusal.message.clone()),
                // The handler failed or panicked: a server bug, not a state of the key
                // (a 409 would have the client retry a bug forever).
                None => internal_response("handler_failed", &msg),
            };
        }
        Some(idem::Error::ResultTooLarge { .. } | idem::Error::TransactionEnded { .. }) => {
            return internal_response("handler_failed", &msg);
        }
        // Every attempt this key allows failed: retrying it changes nothing; a new request
        // needs a new key.
        Some(idem::Error::AttemptsExhausted { .. }) => {
            return json_error(StatusCode::UNPROCESSABLE_ENTITY, "attempts_exhausted", msg);
        }
        _ => {}
    }
    match e.kind() {
        ErrorKind::Rejected => json_error(StatusCode::CONFLICT, "rejected", msg),
        ErrorKind::Retry => json_error(StatusCode::SERVICE_UNAVAILABLE, "retry", msg),
        ErrorKind::Reacquire if matches!(e, Error::Fenced { .. }) => {
            json_error(StatusCode::SERVICE_UNAVAILABLE, "fenced", msg)
        }
        ErrorKind::Reacquire => json_error(StatusCode::SERVICE_UNAVAILABLE, "reacquire", msg),
        ErrorKind::Input => json_error(StatusCode::BAD_REQUEST, "input", msg),
        ErrorKind::Corrupt => internal_response("corrupt", &msg),
        ErrorKind::Fatal => internal_response("fatal", &msg),
    }
}

/// The `outcome` label of [`crate::metrics::REQUESTS`] for an org error.
pub(crate) fn outcome(e: &Error) -> &'static str {
    if e.is_fingerprint_mismatch() {
        return "mismatch";
    }
    match e.idem() {
        Some(idem::Error::Apply { source, .. }) if source.downcast_ref::<Refusal>().is_some() => {
            return "refused";
        }
        Some(
            idem::Error::Apply { .. }
            | idem::Error::ResultTooLarge { .. }
            | idem::Error::TransactionEnded { .. },
        ) => return "error",
        _ => {}
    }
    match e.kind() {
        ErrorKind::Rejected => "rejected",
        ErrorKind::Reacquire if matches!(e, Error::Fenced { .. }) => "fenced",
        ErrorKind::Retry | ErrorKind::Reacquire => "unavailable",
        ErrorKind::Input => "input",
        ErrorKind::Corrupt | ErrorKind::Fatal => "error",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use idem_replica::OrgId;

    fn answer(
        e: Error,
    ) -> Result<(StatusCode, Option<String>, String), Box<dyn std::error::Error>> {
        let resp = error_response(&e);
        let status = resp.status();
        let retry = resp
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().map(str::to_owned))
            .transpose()?;
        let body = futures_body(resp)?;
        let json: serde_json::Value = serde_json::from_slice(&body)?;
        let kind = json["kind"].as_str().ok_or("no kind")?.to_owned();
        assert!(
            json["error"].is_string(),
            "every error names itself: {json}"
        );
        Ok((status, retry, kind))
    }

    fn futures_body(resp: Response) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let rt = tokio::runtime::Builder::new_current_thread().build()?;
        Ok(rt
            .block_on(axum::body::to_bytes(resp.into_body(), 1 << 20))?
            .to_vec())
    }

    #[test]
    fn every_failure_kind_has_its_status_in_one_table() -> Result<(), Box<dyn std::error::Error>> {
        let org = OrgId::new("acme")?;
        let idem = |source: idem::Error| Error::Idem {
            org: org.clone(),
            source: Box::new(source),
        };
        let cases = [
            (
                idem(idem::Error::FingerprintMismatch { key: "k".into() }),
                StatusCode::UNPROCESSABLE_ENTITY,
                None,
                "mismatch",
            ),
            (
                idem(idem::Error::Apply {
                    key: "k".into(),
                    source: Box::new(Refusal::new(StatusCode::PAYMENT_REQUIRED, "no funds")),
                }),
                StatusCode::PAYMENT_REQUIRED,
                None,
                "refused",
            ),
            (
                idem(idem::Error::AttemptsExhausted {
                    key: "k".into(),
                    attempts: 3,
                    last_error: "x".into(),
                }),
                StatusCode::UNPROCESSABLE_ENTITY,
                None,
                "attempts_exhausted",
            ),
            (
                idem(idem::Error::Apply {
                    key: "k".into(),
                    source: "apply panicked".into(),
                }),
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                "handler_failed",
            ),
            (
                Error::ShipFailed {
                    org: org.clone(),
                    source: Arc::new(idem_replica::Error::Injected {
                        point: idem_replica::FailPoint::ShipBeforeUpload,
                        org: "acme".into(),
                        message: "store down".into(),
                    }),
                },
                StatusCode::SERVICE_UNAVAILABLE,
                Some("1".to_owned()),
                "retry",
            ),
            (
                Error::Fenced {
                    org: org.clone(),
                    ours: 3,
                },
                StatusCode::SERVICE_UNAVAILABLE,
                Some("1".to_owned()),
                "fenced",
            ),
            (
                Error::InvalidSettings {
                    reason: "zero".into(),
                },
                StatusCode::BAD_REQUEST,
                None,
                "input",
            ),
            (
                Error::CommitMismatch {
                    org: org.clone(),
                    hydrated: 7,
                    in_file: 5,
                },
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                "corrupt",
            ),
            (
                Error::WriterGone { org: org.clone() },
                StatusCode::SERVICE_UNAVAILABLE,
                Some("1".to_owned()),
                "reacquire",
            ),
        ];
        for (e, status, retry, kind) in cases {
            let what = e.to_string();
            assert_eq!(answer(e)?, (status, retry, kind.to_owned()), "{what}");
        }
        Ok(())
    }

    #[test]
    fn a_500_says_internal_error_with_an_id_and_nothing_of_its_cause()
    -> Result<(), Box<dyn std::error::Error>> {
        let org = OrgId::new("acme")?;
        let apply = |source: Box<dyn std::error::Error + Send + Sync>| Error::Idem {
            org: org.clone(),
            source: Box::new(idem::Error::Apply {
                key: "k".into(),
                source,
            }),
        };
        let sql = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(1),
            Some("no such table: secret_ledger".into()),
        );
        let cases = [
            (apply(Box::new(Refusal::from(sql))), "internal"),
            (
                apply(Box::new(Refusal::internal("no such column: ssn"))),
                "internal",
            ),
            (
                apply("no such table: secret_ledger".into()),
                "handler_failed",
            ),
            (
                Error::CommitMismatch {
                    org: org.clone(),
                    hydrated: 7,
                    in_file: 5,
                },
                "corrupt",
            ),
        ];
        let mut ids = std::collections::HashSet::new();
        for (e, kind) in cases {
            let resp = error_response(&e);
            assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
            let json: serde_json::Value = serde_json::from_slice(&futures_body(resp)?)?;
            let id = json["error_id"].as_str().ok_or("no error_id")?.to_owned();
            assert_eq!(id.len(), 12, "{json}");
            assert_eq!(json["kind"], kind);
            assert_eq!(json["error"], format!("internal error (id {id})"));
            assert!(ids.insert(id), "ids repeat");
        }
        Ok(())
    }

    #[test]
    fn outcomes_name_fenced_apart_from_other_503s() -> Result<(), Box<dyn std::error::Error>> {
        let org = OrgId::new("acme")?;
        let fenced = Error::Fenced {
            org: org.clone(),
            ours: 2,
        };
        let closed = Error::Closed {
            org: org.clone(),
            round: 2,
        };
        let mismatch = Error::Idem {
            org: org.clone(),
            source: Box::new(idem::Error::FingerprintMismatch { key: "k".into() }),
        };
        let refused = Error::Idem {
            org,
            source: Box::new(idem::Error::Apply {
                key: "k".into(),
                source: Box::new(Refusal::new(StatusCode::CONFLICT, "no")),
            }),
        };
        assert_eq!(
            [&fenced, &closed, &mismatch, &refused].map(outcome),
            ["fenced", "unavailable", "mismatch", "refused"]
        );
        Ok(())
    }

    #[test]
    fn a_held_lease_says_when_to_retry() -> Result<(), Box<dyn std::error::Error>> {
        let acme = OrgId::new("acme")?;
        let held_draining = |retry_after_ms, draining| Error::Replica {
            org: acme.clone(),
            source: Box::new(idem_replica::Error::LeaseHeld {
                org: "acme".into(),
                holder: "replica-a".into(),
                retry_after_ms,
                holder_addr: None,
                draining,
            }),
        };
        let held = |retry_after_ms| held_draining(retry_after_ms, false);
        let (status, retry, kind) = answer(held(29_500))?;
        assert_eq!(
            (status, kind.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "retry")
        );
        // The wait rounded up to whole seconds, whatever the wall clock reads.
        assert_eq!(retry.as_deref(), Some("30"));
        // Almost through the watch: retry in a second, never 0.
        assert_eq!(answer(held(5))?.1.as_deref(), Some("1"));
        // A draining holder is not named as where to go: it takes no new request.
        let named = |draining| Error::Replica {
            org: acme.clone(),
            source: Box::new(idem_replica::Error::LeaseHeld {
                org: "acme".into(),
                holder: "replica-a".into(),
                retry_after_ms: 29_500,
                holder_addr: Some("http://a:8080".into()),
                draining,
            }),
        };
        let holder = |e: Error| -> Result<serde_json::Value, Box<dyn std::error::Error>> {
            let json: serde_json::Value =
                serde_json::from_slice(&futures_body(error_response(&e))?)?;
            Ok(json["holder"].clone())
        };
        assert_eq!(holder(named(false))?, "http://a:8080");
        assert_eq!(holder(named(true))?, serde_json::Value::Null);
        assert_eq!(named(true).holder_addr(), None);
        // A draining holder releases the org any moment: a second, not the watch's 30.
        let (status, retry, kind) = answer(held_draining(29_500, true))?;
        assert_eq!(
            (status, retry.as_deref(), kind.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("1"), "retry")
        );
        Ok(())
    }
}
