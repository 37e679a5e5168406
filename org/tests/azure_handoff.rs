//! The writer handoff (I6–I8) on the Azure Blob API (Azurite), the scenarios `s3_handoff.rs`
//! runs on S3: replica A acknowledges, B claims with force, A's late ship is fenced, and
//! clients' retries on B replay or run exactly once; and a graceful release.
//!
//! Ignored unless asked for, and failing when no server is configured:
//! `scripts/azure-server -- cargo test -p idem-org --test azure_handoff -- --include-ignored`.

mod common;

use common::{R, scenarios};
use idem_replica::conformance::{azure_store, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Azurite: run under scripts/azure-server"]
async fn handoff_on_azure_replays_acknowledged_and_runs_unacknowledged_exactly_once() -> R {
    scenarios::handoff(azure_store(), &unique_prefix("org-handoff")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Azurite: run under scripts/azure-server"]
async fn release_on_azure_lets_the_successor_claim_at_once_and_see_everything() -> R {
    scenarios::release(azure_store(), &unique_prefix("org-release")).await
}
