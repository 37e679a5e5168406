//! Answers for requests no route takes, in the layer's JSON error shape: an application's
//! 404 and 405 read like every other error it returns (`{"error", "kind"}`), not as an empty
//! body a client cannot tell from a proxy's.

use axum::Router;
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;

use super::json_error;

/// `router` with a 404 for an unknown path and a 405 for a known path with another method
/// (axum keeps the `Allow` header on it), both `{"error", "kind": "input"}`: the request
/// is wrong, retrying it will not help.
pub fn json_fallbacks<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

async fn not_found(method: Method, uri: Uri) -> Response {
    json_error(
        StatusCode::NOT_FOUND,
        "input",
        format!("no route for {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    json_error(
        StatusCode::METHOD_NOT_ALLOWED,
        "input",
        format!("{method} is not allowed on {}", uri.path()),
    )
}
