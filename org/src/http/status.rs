//! Every failure as an HTTP answer, in one table, with one JSON shape:
//! `{"error": "<message>", "kind": "<kind>"}`.
//!
//! | failure | status | kind |
//! |---|---|---|
//! | another payload under an applied key (I4) | 422 | `mismatch` |
//! | the handler's [`Refusal`] (not stored) | the refusal's | the refusal's |
//! | the handler failed otherwise, panicked, or its response is too large to store | 500 | `handler_failed` |
//! | every attempt the key allows failed | 422 | `attempts_exhausted` |
//! | other rejections (an effect in the wrong state) | 409 | `rejected` |
//! | `Retry` (ship failed, store down, lease held elsewhere, busy) | 503 + `Retry-After: 1` (a held lease: its remaining seconds, and `"holder": <its address>` when advertised) | `retry` |
//! | `Reacquire`: fenced by a newer round | 503 + `Retry-After: 1` | `fenced` |
//! | `Reacquire`: closed, claim lost, poisoned (the next request re-acquires) | 503 + `Retry-After: 1` | `reacquire` |
//! | `Input` (bad key, bad org id) | 400 | `input` |
//! | `Corrupt` | 500 | `corrupt` |
//! | `Fatal` | 500 | `fatal` |

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::{Error, ErrorKind};

/// An answer the handler gives without storing it: its transaction rolls back, the attempt
/// is counted, and a retry under the same key runs the handler again. For answers that must
/// replay (a declined payment), return a [`super::StoredResponse`] with that status instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct Refusal {
    status: StatusCode,
    kind: String,
    message: String,
}

impl Refusal {
    /// A refusal with `status` and a message for the JSON body (`kind` is `refused`).
    pub fn new(status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            kind: "refused".into(),
            message: message.into(),
        }
    }

    /// A 500 for a failure of the handler's own work (an SQL error): the message is the
    /// error's text.
    pub fn internal(e: impl std::fmt::Display) -> Refusal {
        Refusal {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "internal".into(),
            message: e.to_string(),
        }
    }

    /// The status it answers with.
    pub fn status(&self) -> StatusCode {
        self.status
    }
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

/// The answer for an org error (the module's table). The message names the cause chain; a
/// 503 for an org another writer's lease holds says when to retry (`Retry-After`: the seconds,
/// rounded up, this replica still has to see the lease unchanged before it may claim).
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
                Some(refusal) => json_error(refusal.status, &refusal.kind, refusal.message.clone()),
                // The handler failed or panicked: a server bug, not a state of the key
                // (a 409 would have the client retry a bug forever).
                None => json_error(StatusCode::INTERNAL_SERVER_ERROR, "handler_failed", msg),
            };
        }
        Some(idem::Error::ResultTooLarge { .. } | idem::Error::TransactionEnded { .. }) => {
            return json_error(StatusCode::INTERNAL_SERVER_ERROR, "handler_failed", msg);
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
        ErrorKind::Corrupt => json_error(StatusCode::INTERNAL_SERVER_ERROR, "corrupt", msg),
        ErrorKind::Fatal => json_error(StatusCode::INTERNAL_SERVER_ERROR, "fatal", msg),
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
        let held = |retry_after_ms| Error::Replica {
            org: acme.clone(),
            source: Box::new(idem_replica::Error::LeaseHeld {
                org: "acme".into(),
                holder: "replica-a".into(),
                retry_after_ms,
                holder_addr: None,
            }),
        };
        let (status, retry, kind) = answer(held(29_500))?;
        assert_eq!(
            (status, kind.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "retry")
        );
        // The wait rounded up to whole seconds, whatever the wall clock reads.
        assert_eq!(retry.as_deref(), Some("30"));
        // Almost through the watch: retry in a second, never 0.
        assert_eq!(answer(held(5))?.1.as_deref(), Some("1"));
        Ok(())
    }
}
