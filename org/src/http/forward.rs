//! Forwarding (opt-in, feature `forward`): a replica that does not hold an org sends the
//! request to the replica that does, when that one advertised its (`http://`) address in
//! its process lease, and relays the answer (status, headers, `Idempotent-Replayed`, body) unchanged, so
//! any replica behind a load balancer that knows nothing of tenants answers.
//!
//! ```text
//! request for org o ─► this replica: once_with ─► LeaseHeld { holder_addr: Some(url) }
//!     hops < max_hops? ─► POST url + path (same headers, same body, Idem-Forwarded-Hops + 1)
//!         answered within the timeout ─► that answer, byte for byte
//!         no answer (down, killed mid-way, timeout, a bad address) ─► the 503 this replica
//!                                                                  would have sent
//! ```
//!
//! The holder still decides: the request runs there under its own `once` (I1, I7), so a
//! forward never applies anything here, and a forward that gets no answer is a 503 the
//! client retries under the same key: whether the holder applied it or not, the retry is a
//! replay or the one application (I2). The hop count bounds loops between replicas that
//! each think the other holds the org.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;

use super::IdempotentRequest;

/// The header carrying how many times a request was forwarded already.
pub const FORWARDED_HOPS: &str = "idem-forwarded-hops";

/// The largest answer relayed, in bytes: a stored response is bounded by the holder's own
/// limits; anything longer is not relayed (the client gets this replica's 503).
pub const MAX_FORWARDED_BODY: usize = 16 << 20;

/// Headers that belong to one connection (RFC 9110 section 7.6.1), never forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// How [`super::Idempotency::forwarding`] forwards: an HTTP client, the time a forwarded
/// request may take in all (connect, send, answer), and the most hops.
#[derive(Clone, Debug)]
pub struct Forwarding {
    client: reqwest::Client,
    max_hops: u32,
}

impl Forwarding {
    /// Forwarding with `timeout` per forwarded request (the whole exchange) and at most
    /// `max_hops` forwards in a row (1 is enough when the holder's address is current).
    ///
    /// # Errors
    /// The HTTP client could not be built (the system's TLS or DNS configuration).
    pub fn new(timeout: Duration, max_hops: u32) -> Result<Forwarding, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()?;
        Ok(Forwarding { client, max_hops })
    }

    /// True when `request` may be forwarded once more.
    pub(crate) fn may_forward(&self, request: &IdempotentRequest) -> bool {
        hops(request.headers()) < self.max_hops
    }

    /// Sends `request` to the holder at `addr` (an `http://` base URL, as `idem serve
    /// --advertise` writes it) and returns its answer.
    ///
    /// # Errors
    /// Why there is no answer to relay: a bad address, no connection, a timeout, a body over
    /// [`MAX_FORWARDED_BODY`].
    pub(crate) async fn forward(
        &self,
        addr: &str,
        request: &IdempotentRequest,
    ) -> Result<Response, String> {
        let base =
            reqwest::Url::parse(addr).map_err(|e| format!("holder address {addr:?}: {e}"))?;
        // Replicas reach each other on an internal network: plain HTTP, no TLS stack.
        if base.scheme() != "http" {
            return Err(format!("holder address {addr:?} is not http://"));
        }
        let path = request
            .uri()
            .path_and_query()
            .map_or(request.uri().path(), |p| p.as_str());
        let url = format!("{}{path}", addr.trim_end_matches('/'));
        let mut headers = HeaderMap::new();
        for (name, value) in request.headers() {
            if !hop_by_hop(name) && name.as_str() != FORWARDED_HOPS {
                headers.append(name.clone(), value.clone());
            }
        }
        let next = hops(request.headers()).saturating_add(1);
        headers.insert(
            HeaderName::from_static(FORWARDED_HOPS),
            HeaderValue::from(next),
        );
        let mut answer = self
            .client
            .request(request.method().clone(), &url)
            .headers(headers)
            .body(request.body().clone())
            .send()
            .await
            .map_err(|e| format!("forwarding to {url}: {e}"))?;
        let mut body = Vec::new();
        while let Some(chunk) = answer
            .chunk()
            .await
            .map_err(|e| format!("reading the answer of {url}: {e}"))?
        {
            if body.len() + chunk.len() > MAX_FORWARDED_BODY {
                return Err(format!(
                    "the answer of {url} is over {MAX_FORWARDED_BODY} bytes"
                ));
            }
            body.extend_from_slice(&chunk);
        }
        let mut relayed = Response::new(Body::from(body));
        *relayed.status_mut() = answer.status();
        for (name, value) in answer.headers() {
            if !hop_by_hop(name) && name != axum::http::header::CONTENT_LENGTH {
                relayed.headers_mut().append(name.clone(), value.clone());
            }
        }
        Ok(relayed)
    }
}

fn hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}

/// The forwards a request has made so far (0 when the header is absent or not a number).
fn hops(headers: &HeaderMap) -> u32 {
    headers
        .get(FORWARDED_HOPS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
