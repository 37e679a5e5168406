//! The `Idempotency-Key` request header (IETF draft `draft-ietf-httpapi-idempotency-key-header`:
//! one Structured Field item, a string).

use axum::http::HeaderMap;

/// The header's name.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Reads the idempotency key of a request.
///
/// Exactly one field with one value: a second field, or a value that is a list (`k, k`), is
/// refused, so one logical request can never run under two keys. The key is 1–255 visible
/// ASCII characters (0x21–0x7E); it may be sent as an sf-string (`"abc"` is the key `abc`,
/// with `\"` and `\\` escapes) or bare, as most clients do. Anything else — a space, a TAB
/// or another control byte — is refused. The key's length and character rules are then
/// checked by `idem::validate_key`.
///
/// # Errors
/// Why the header is refused, for a 400.
pub fn idempotency_key(headers: &HeaderMap) -> Result<String, String> {
    let mut fields = headers.get_all(IDEMPOTENCY_KEY).iter();
    let (Some(value), None) = (fields.next(), fields.next()) else {
        return Err(if headers.contains_key(IDEMPOTENCY_KEY) {
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
    let key = String::from_utf8(key).map_err(|_| "Idempotency-Key must be visible ASCII")?;
    idem::validate_key(&key).map_err(|e| e.to_string())?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            if let Ok(v) = HeaderValue::from_bytes(v) {
                h.append(IDEMPOTENCY_KEY, v);
            }
        }
        h
    }

    #[test]
    fn accepts_bare_and_sf_string_keys() {
        assert_eq!(idempotency_key(&with(&[b"abc-1"])), Ok("abc-1".into()));
        assert_eq!(idempotency_key(&with(&[b"\"abc-1\""])), Ok("abc-1".into()));
        assert_eq!(
            idempotency_key(&with(&[br#""a\"b\\c""#])),
            Ok(r#"a"b\c"#.into())
        );
        assert_eq!(idempotency_key(&with(&[b"  k  "])), Ok("k".into()));
    }

    #[test]
    fn refuses_what_could_run_one_request_under_two_keys_or_none() {
        for bad in [
            with(&[]),
            with(&[b"a", b"b"]),
            with(&[b"a, b"]),
            with(&[b"\"a\", \"b\""]),
            with(&[b"a b"]),
            with(&[b"\"a"]),
            with(&[b"\"a\\x\""]),
            with(&[b"\"\""]),
            with(&[b"a\tb"]),
        ] {
            assert!(idempotency_key(&bad).is_err(), "{bad:?}");
        }
        let long = "k".repeat(idem::MAX_KEY_BYTES + 1);
        assert!(idempotency_key(&with(&[long.as_bytes()])).is_err());
    }
}
