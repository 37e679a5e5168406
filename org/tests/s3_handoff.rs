//! The writer handoff (I6–I8) on a real S3 API: replica A acknowledges, B claims with force,
//! A's late ship is fenced, and clients' retries on B replay or run exactly once.
//!
//! Ignored unless asked for, and failing when no server is configured:
//! `scripts/s3-server -- cargo test -p idem-org -- --include-ignored` starts moto's S3 server
//! on loopback, sets `IDEM_S3_ENDPOINT` and runs them.

mod common;

use common::{R, scenarios};
use idem_replica::conformance::{s3_store, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a loopback S3 server: run under scripts/s3-server"]
async fn handoff_on_s3_replays_acknowledged_and_runs_unacknowledged_exactly_once() -> R {
    scenarios::handoff(s3_store(), &unique_prefix("org-handoff")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a loopback S3 server: run under scripts/s3-server"]
async fn release_on_s3_lets_the_successor_claim_at_once_and_see_everything() -> R {
    scenarios::release(s3_store(), &unique_prefix("org-release")).await
}
