//! An HTTP idempotency layer for any axum handler: the IETF `Idempotency-Key` draft over
//! [`Registry`], so an embedder writes routes, not idempotency.
//!
//! ```text
//! request ─► IdempotentRequest (extractor): Idempotency-Key parsed (400), body read (413)
//!         ─► Idempotency::run(tenant org, request, handler)
//!              same key in flight on this replica ─► 409
//!              registry.once_with(org, key, fingerprint(method, path, body), handler in the tx)
//!                first run ─► the handler's StoredResponse, after the ship (I6)
//!                replay    ─► the stored response, byte for byte, Idempotent-Replayed: true
//!                other payload under the key ─► 422;  errors by kind (one table)
//! ```
//!
//! Every answer the layer gives for a failure, its status and its `kind`, is in one table:
//! [`error_response`]. A 500 never carries the failure's text to the client: its body is
//! `"internal error (id ID)"`, and the log line with that `error_id` holds the cause.
//!
//! **Tenant isolation (I12).** The org is an argument, never read from the request here: the
//! application passes the tenant its own authentication established (its extractor), so a
//! request authenticated for one tenant cannot read, replay or write another's keys whatever
//! path or header it sends.
//!
//! ```
//! # use idem_org::http::{Idempotency, IdempotentRequest, StoredResponse, Refusal};
//! # use idem_org::replica::OrgId;
//! use axum::http::StatusCode;
//! use axum::response::Response;
//!
//! /// The application's own authentication: here a header; in production a verified token.
//! struct Tenant(OrgId);
//!
//! async fn create_order(idem: &Idempotency, Tenant(org): Tenant, req: IdempotentRequest) -> Response {
//!     idem.run(&org, req, |tx, req| {
//!         let cents: i64 = std::str::from_utf8(req.body())
//!             .ok()
//!             .and_then(|s| s.trim().parse().ok())
//!             .ok_or_else(|| Refusal::new(StatusCode::BAD_REQUEST, "body is not cents"))?;
//!         // `?` on an SQL error: a 500 with an error id; its text goes to the log only.
//!         tx.execute("INSERT INTO orders (cents) VALUES (?1)", [cents])?;
//!         Ok(StoredResponse::new(StatusCode::CREATED, format!("order {}", tx.last_insert_rowid())))
//!     })
//!     .await
//! }
//! ```
//! (`examples/axum_service.rs` in the repository is a complete service.)

mod fallback;
#[cfg(feature = "forward")]
mod forward;
mod key;
mod status;
mod stored;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use idem_replica::OrgId;
use rusqlite::Transaction;
use sha2::{Digest, Sha256};

pub use fallback::json_fallbacks;
#[cfg(feature = "forward")]
pub use forward::{FORWARDED_HOPS, Forwarding, MAX_FORWARDED_BODY};
pub use key::{IDEMPOTENCY_KEY, idempotency_key};
pub use status::{INTERNAL_MESSAGE, Refusal, error_response, json_error};
pub use stored::StoredResponse;

use crate::Registry;
use crate::sync::lock;

/// How a request is fingerprinted: the bytes returned are hashed and stored with the key; a
/// later request under the key with other bytes gets 422 (I4).
pub type FingerprintFn = Arc<dyn Fn(&IdempotentRequest) -> Vec<u8> + Send + Sync>;

/// The idempotency layer: a registry, the fingerprint rule, and the keys in flight on this
/// replica. Cheap to clone; use it as (part of) the router's state.
#[derive(Clone)]
pub struct Idempotency {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    fingerprint: FingerprintFn,
    inflight: Mutex<HashSet<(OrgId, String)>>,
    #[cfg(feature = "forward")]
    forwarding: Option<Forwarding>,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").finish_non_exhaustive()
    }
}

/// The default fingerprint: method, path with query, and body (headers are left out: clients
/// and proxies add and reorder them between retries).
pub fn default_fingerprint(req: &IdempotentRequest) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(req.method.as_str());
    h.update(b"\n");
    h.update(
        req.uri
            .path_and_query()
            .map_or(req.uri.path(), |p| p.as_str()),
    );
    h.update(b"\n");
    h.update(&req.body);
    h.finalize().to_vec()
}

impl Idempotency {
    /// The layer over `registry`, fingerprinting with [`default_fingerprint`].
    pub fn new(registry: Registry) -> Idempotency {
        Idempotency {
            inner: Arc::new(Inner {
                registry,
                fingerprint: Arc::new(default_fingerprint),
                inflight: Mutex::new(HashSet::new()),
                #[cfg(feature = "forward")]
                forwarding: None,
            }),
        }
    }

    /// Replaces the fingerprint rule (for example, the body only, or a canonical form of a
    /// JSON body). Call before cloning the layer.
    #[must_use]
    pub fn fingerprint(
        self,
        f: impl Fn(&IdempotentRequest) -> Vec<u8> + Send + Sync + 'static,
    ) -> Idempotency {
        Idempotency {
            inner: Arc::new(Inner {
                registry: self.inner.registry.clone(),
                fingerprint: Arc::new(f),
                inflight: Mutex::new(HashSet::new()),
                #[cfg(feature = "forward")]
                forwarding: self.inner.forwarding.clone(),
            }),
        }
    }

    /// Forwards a request for an org another live replica holds, when that replica
    /// advertised its address, and relays its answer (see [`Forwarding`]); without it such a
    /// request is a 503 naming the holder. Call before cloning the layer.
    #[cfg(feature = "forward")]
    #[must_use]
    pub fn forwarding(self, forwarding: Forwarding) -> Idempotency {
        Idempotency {
            inner: Arc::new(Inner {
                registry: self.inner.registry.clone(),
                fingerprint: self.inner.fingerprint.clone(),
                inflight: Mutex::new(HashSet::new()),
                forwarding: Some(forwarding),
            }),
        }
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Runs `handler` at most once for the request's idempotency key in `org` — inside the
    /// org's transaction, so its writes and the stored response commit together (I1) — and
    /// answers: its response once shipped (201, whatever it chose), the stored response on a
    /// replay, or the error response for the kind of failure (see [`error_response`]).
    ///
    /// `org` must be the tenant the application authenticated, not a value taken unchecked
    /// from the request (I12). `handler` returns [`Refusal`] for an answer it does not want
    /// stored (the transaction rolls back; a retry with the key runs again).
    pub async fn run<H>(&self, org: &OrgId, request: IdempotentRequest, handler: H) -> Response
    where
        H: FnOnce(&Transaction<'_>, &IdempotentRequest) -> Result<StoredResponse, Refusal>
            + Clone
            + Send
            + 'static,
    {
        let key = request.key.clone();
        let id = (org.clone(), key.clone());
        if !lock(&self.inner.inflight).insert(id.clone()) {
            counted("in_flight");
            return status::json_error(
                axum::http::StatusCode::CONFLICT,
                "in_flight",
                format!("a request with idempotency key {key:?} is still in flight"),
            );
        }
        let _guard = InFlight(&self.inner, id);
        let opts = idem::Options::new().fingerprint((self.inner.fingerprint)(&request));
        let request = Arc::new(request);
        #[cfg(feature = "forward")]
        let original = request.clone();
        let apply = move |tx: &Transaction<'_>| {
            handler(tx, &request).and_then(|r| r.encode().map_err(Refusal::internal))
        };
        match self.inner.registry.once_with(org, &key, opts, apply).await {
            Ok(out) => match StoredResponse::decode(&out.result) {
                Ok(stored) => {
                    counted(if out.applied { "applied" } else { "replayed" });
                    stored.into_response(!out.applied)
                }
                Err(why) => {
                    counted("error");
                    status::internal_response(
                        "corrupt",
                        &format!("org {org}: idempotency key {key:?}: {why}"),
                    )
                }
            },
            Err(e) => {
                #[cfg(feature = "forward")]
                if let (Some(fwd), Some(addr)) = (&self.inner.forwarding, e.holder_addr())
                    && fwd.may_forward(&original)
                {
                    match fwd.forward(addr, &original).await {
                        Ok(answer) => {
                            counted("forwarded");
                            return answer;
                        }
                        Err(why) => {
                            tracing::warn!(%org, key = %original.key(), error = %why, "forwarding to the holder got no answer");
                        }
                    }
                }
                counted(status::outcome(&e));
                error_response(&e)
            }
        }
    }
}

fn counted(outcome: &'static str) {
    crate::metrics::record_request(outcome);
}

/// Removes a key from the in-flight set when its request ends, however it ends.
struct InFlight<'a>(&'a Inner, (OrgId, String));
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(&self.0.inflight).remove(&self.1);
    }
}

/// A request under an idempotency key: the key (parsed and validated), method, URI, headers
/// and the whole body. An axum extractor: a missing or malformed key is a 400, a body over
/// the router's `DefaultBodyLimit` a 413, both with the layer's JSON error shape.
#[derive(Debug, Clone)]
pub struct IdempotentRequest {
    key: String,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

impl IdempotentRequest {
    /// The idempotency key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The URI.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }
}

impl<S: Send + Sync> FromRequest<S> for IdempotentRequest {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let key = idempotency_key(&parts.headers).map_err(|why| {
            counted("input");
            status::json_error(axum::http::StatusCode::BAD_REQUEST, "input", why)
        })?;
        let body = Bytes::from_request(Request::from_parts(parts.clone(), body), state)
            .await
            .map_err(|rejection| {
                counted("input");
                status::json_error(rejection.status(), "input", rejection.body_text())
                    .into_response()
            })?;
        Ok(IdempotentRequest {
            key,
            method: parts.method,
            uri: parts.uri,
            headers: parts.headers,
            body,
        })
    }
}
