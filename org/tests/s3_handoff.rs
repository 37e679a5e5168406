//! The writer handoff (I6–I8) on a real S3 API: replica A acknowledges, B claims with force,
//! A's late ship is fenced, and clients' retries on B replay or run exactly once.
//!
//! `scripts/s3-server -- cargo test` starts moto's S3 server on loopback and sets
//! `IDEM_S3_ENDPOINT`; without it the tests pass after printing
//! "skipped: IDEM_S3_ENDPOINT not set".

mod common;

use std::sync::Arc;

use common::{R, scenarios};
use idem_replica::conformance;
use object_store::ObjectStore;

fn s3() -> Option<Arc<dyn ObjectStore>> {
    match conformance::s3_store_from_env() {
        Ok(Some(store)) => Some(store),
        Ok(None) => {
            eprintln!(
                "skipped: {} not set (run under scripts/s3-server)",
                conformance::S3_ENDPOINT_ENV
            );
            None
        }
        Err(e) => panic!("building the S3 store: {e}"),
    }
}

fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("s3org-{tag}-{}-{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_on_s3_replays_acknowledged_and_runs_unacknowledged_exactly_once() -> R {
    let Some(store) = s3() else { return Ok(()) };
    scenarios::handoff(store, &unique("handoff")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_on_s3_lets_the_successor_claim_at_once_and_see_everything() -> R {
    let Some(store) = s3() else { return Ok(()) };
    scenarios::release(store, &unique("release")).await
}
