//! The response an idempotent handler stores with its key, and replays byte for byte.

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// Marks the stored bytes: format name and version.
const MAGIC: &[u8] = b"idem-http/1\n";

/// A response to store with the idempotency key: its status, the headers the application
/// chose to store, and its body. The first request gets it; every replay gets it again, byte
/// for byte, with `Idempotent-Replayed: true` added (I3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
}

impl StoredResponse {
    /// A response with `status` and `body` (bytes, as sent) and no stored headers.
    pub fn new(status: StatusCode, body: impl Into<Bytes>) -> StoredResponse {
        StoredResponse {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// A JSON response: `body` serialized, `Content-Type: application/json` stored with it.
    ///
    /// # Errors
    /// The serializer's error.
    pub fn json<T: serde::Serialize>(
        status: StatusCode,
        body: &T,
    ) -> Result<StoredResponse, serde_json::Error> {
        Ok(
            StoredResponse::new(status, serde_json::to_vec(body)?).header(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
        )
    }

    /// Stores a header with the response (replays send it again).
    #[must_use]
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> StoredResponse {
        self.headers.push((name, value));
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stored headers, in order.
    pub fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.headers
    }

    /// The body bytes.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The bytes stored as the key's result: magic, status (u16 BE), header count (u16 BE),
    /// each header as name length (u16 BE), name, value length (u16 BE), value; then the body.
    ///
    /// # Errors
    /// More than 65,535 headers, or a header value over 65,535 bytes: refused rather than
    /// stored cut, since a replay must be the first answer byte for byte.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(MAGIC.len() + 4 + self.body.len() + 64);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.status.as_u16().to_be_bytes());
        let n = u16::try_from(self.headers.len())
            .map_err(|_| format!("{} headers: at most 65535 are stored", self.headers.len()))?;
        out.extend_from_slice(&n.to_be_bytes());
        for (name, value) in &self.headers {
            for part in [name.as_str().as_bytes(), value.as_bytes()] {
                let len = u16::try_from(part.len()).map_err(|_| {
                    format!(
                        "header {name}: {} bytes, at most 65535 are stored",
                        part.len()
                    )
                })?;
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(part);
            }
        }
        out.extend_from_slice(&self.body);
        Ok(out)
    }

    /// Reads what [`StoredResponse::encode`] wrote.
    ///
    /// # Errors
    /// What in the bytes is not a stored response (a key applied by something other than
    /// this layer, or damaged bytes).
    pub(crate) fn decode(bytes: &[u8]) -> Result<StoredResponse, String> {
        let mut rest = bytes
            .strip_prefix(MAGIC)
            .ok_or("the key's stored result is not an HTTP response")?;
        let mut u16_at = |what: &str| -> Result<u16, String> {
            let (head, tail) = rest
                .split_first_chunk::<2>()
                .ok_or(format!("stored response cut short in its {what}"))?;
            rest = tail;
            Ok(u16::from_be_bytes(*head))
        };
        let status = StatusCode::from_u16(u16_at("status")?).map_err(|e| e.to_string())?;
        let count = u16_at("header count")?;
        let mut headers = Vec::with_capacity(usize::from(count).min(64));
        for _ in 0..count {
            let mut part = |what: &str| -> Result<&[u8], String> {
                let (head, tail) = rest
                    .split_first_chunk::<2>()
                    .ok_or(format!("stored response cut short in a {what}"))?;
                let len = usize::from(u16::from_be_bytes(*head));
                if tail.len() < len {
                    return Err(format!("stored response cut short in a {what}"));
                }
                let (value, tail) = tail.split_at(len);
                rest = tail;
                Ok(value)
            };
            let name = HeaderName::from_bytes(part("header name")?).map_err(|e| e.to_string())?;
            let value =
                HeaderValue::from_bytes(part("header value")?).map_err(|e| e.to_string())?;
            headers.push((name, value));
        }
        Ok(StoredResponse {
            status,
            headers,
            body: Bytes::copy_from_slice(rest),
        })
    }

    /// The HTTP response; `replayed` adds `Idempotent-Replayed: true`.
    pub(crate) fn into_response(self, replayed: bool) -> Response {
        let mut resp = (self.status, self.body).into_response();
        let h: &mut HeaderMap = resp.headers_mut();
        // A stored header replaces the framework's default of that name (the body's
        // `application/octet-stream`); a name stored more than once keeps every value.
        let mut seen = std::collections::HashSet::new();
        for (name, value) in self.headers {
            if seen.insert(name.clone()) {
                h.insert(name, value);
            } else {
                h.append(name, value);
            }
        }
        if replayed {
            h.insert(
                HeaderName::from_static("idempotent-replayed"),
                HeaderValue::from_static("true"),
            );
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_status_headers_and_body_byte_for_byte() -> Result<(), String> {
        let r = StoredResponse::new(StatusCode::CREATED, &b"\x00{\"id\":7}\xff"[..])
            .header(
                HeaderName::from_static("location"),
                HeaderValue::from_static("/orders/7"),
            )
            .header(
                HeaderName::from_static("x-empty"),
                HeaderValue::from_static(""),
            );
        assert_eq!(StoredResponse::decode(&r.encode()?)?, r);
        let empty = StoredResponse::new(StatusCode::NO_CONTENT, Bytes::new());
        assert_eq!(StoredResponse::decode(&empty.encode()?)?, empty);
        Ok(())
    }

    #[test]
    fn a_header_too_long_to_store_is_refused_not_cut() -> Result<(), String> {
        let long = HeaderValue::from_str(&"v".repeat(70_000)).map_err(|e| e.to_string())?;
        let r = StoredResponse::new(StatusCode::OK, Bytes::new())
            .header(HeaderName::from_static("x-big"), long);
        assert!(r.encode().is_err());
        Ok(())
    }

    #[test]
    fn a_stored_content_type_is_the_only_one_sent_and_repeated_names_all_are() {
        let resp = StoredResponse::new(StatusCode::OK, &b"{}"[..])
            .header(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )
            .header(
                HeaderName::from_static("set-cookie"),
                HeaderValue::from_static("a=1"),
            )
            .header(
                HeaderName::from_static("set-cookie"),
                HeaderValue::from_static("b=2"),
            )
            .into_response(true);
        let h = resp.headers();
        let types: Vec<_> = h.get_all(axum::http::header::CONTENT_TYPE).iter().collect();
        assert_eq!(types, ["application/json"]);
        assert_eq!(h.get_all("set-cookie").iter().count(), 2);
        assert_eq!(
            h.get("idempotent-replayed").map(|v| v.as_bytes()),
            Some(&b"true"[..])
        );
    }

    #[test]
    fn damaged_or_foreign_bytes_are_an_error_never_a_panic() {
        let good = StoredResponse::new(StatusCode::OK, &b"body"[..])
            .header(
                HeaderName::from_static("etag"),
                HeaderValue::from_static("\"v1\""),
            )
            .encode()
            .unwrap_or_default();
        for cut in 0..MAGIC.len() + 12 {
            assert!(
                StoredResponse::decode(&good[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        assert!(StoredResponse::decode(b"paid").is_err());
        let mut bad_status = good.clone();
        bad_status[MAGIC.len()..MAGIC.len() + 2].copy_from_slice(&1000u16.to_be_bytes());
        assert!(StoredResponse::decode(&bad_status).is_err());
        let mut huge_count = good;
        huge_count[MAGIC.len() + 2..MAGIC.len() + 4].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(StoredResponse::decode(&huge_count).is_err());
    }
}
