//! The conformance suite, written once over any [`ObjectStore`] (test support, behind the
//! `test-util` feature).
//!
//! Each case takes a fresh store, runs one behaviour under its own random prefix and panics
//! (via `assert!`) on a violated invariant; unexpected errors are returned. [`SUITES`] lists
//! every case; [`conformance_tests!`](crate::conformance_tests) expands one `#[test]` per
//! case for a store, so a test binary runs the whole suite on each backend it covers:
//!
//! ```text
//! mod in_memory {
//!     idem_replica::conformance_tests!(idem_replica::conformance::TestStore::memory());
//! }
//! ```
//!
//! (`ignore`d here: the example expands `#[test]` functions, which a doctest cannot run.)
//!
//! `replica/tests/` runs it on `InMemory`, a local directory, a [`FaultStore`]-wrapped
//! store, and (ignored unless run under `scripts/s3-server`, `scripts/azure-server`) an S3
//! API server ([`s3_store`]) and Azurite ([`azure_store`]). The GCS emulators
//! ([`gcs_store`]) cannot run it through object_store's GCS client; their tests check that
//! the probe refuses them (docs/stores.md). Nothing here assumes local paths in the store;
//! hydration targets a temp directory on the local disk.
//!
//! [`FaultStore`]: crate::testing::fault::FaultStore

mod azure;
mod claims;
mod clock;
mod clone;
mod clone_attack;
mod damage;
mod db;
mod delta;
mod faults;
mod gcs;
mod journal;
mod journal_claim;
mod journal_log;
mod journal_takeover;
mod levels;
mod pipeline;
mod retention;
mod s3;
mod segments;
mod snapshots;

pub use azure::{
    AZURE_CONTAINER_ENV, AZURE_ENDPOINT_ENV, AZURITE_ACCOUNT, AZURITE_ACCOUNT_KEY, azure_store,
    azure_store_from_env,
};
pub use gcs::{
    GCS_BUCKET_ENV, GCS_ENDPOINT_ENV, GCS_STUB_ENDPOINT_ENV, gcs_store, gcs_store_from_env,
};
pub use s3::{S3_BUCKET_ENV, S3_ENDPOINT_ENV, s3_store, s3_store_from_env, unique_prefix};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use object_store::ObjectStore;

use crate::format::layout::new_nonce;
use crate::{Error, OrgId, Replica, Settings, Snapshot};

/// What a case returns: `Ok`, or the unexpected error that stopped it.
pub type CaseResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A running case.
pub type CaseFuture = Pin<Box<dyn Future<Output = CaseResult>>>;

/// One case of the suite: its name (a sentence) and the function that runs it on a store.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// The case's name, as its generated `#[test]` is named.
    pub name: &'static str,
    /// Runs the case on a fresh store.
    pub run: fn(Arc<dyn ObjectStore>) -> CaseFuture,
}

/// The list of cases, written once: [`SUITES`] and [`conformance_tests!`](crate::conformance_tests)
/// are both expanded from it.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($($mode:tt)*) => {
        $crate::__conformance_expand! { [$($mode)*]
            claims::probe_accepts_store,
            claims::claim_rounds_strictly_increase,
            claims::concurrent_claims_get_distinct_rounds,
            claims::overlapping_writers_old_ship_is_fenced,
            claims::release_lets_next_claim_through,
            claims::lease_respected_unless_force,
            claims::org_isolation,
            faults::landed_but_error_put_is_settled_by_reread,
            faults::faults_at_every_put_site,
            faults::corrupt_blob_is_refused_and_nothing_installed,
            faults::unknown_entry_format_is_refused,
            snapshots::retention_keeps_newest,
            clock::retention_on_a_skewed_host_deletes_nothing_by_age,
            snapshots::restore_and_verify,
            snapshots::snapshot_under_concurrent_writes,
            segments::a_segment_shared_by_two_snapshots_survives_retention_of_the_older,
            segments::segments_and_manifests_are_checked,
            segments::a_database_file_ships_as_a_streamed_snapshot,
            delta::delta_chain_hydrates_and_restores_every_position,
            delta::delta_needs_a_snapshot_and_is_fenced,
            delta::compacted_delta_supersedes_the_chain,
            delta::compaction_missing_grown_pages_is_refused,
            delta::a_delta_encoded_against_a_wrong_base_is_refused_before_publishing,
            delta::a_successor_continues_the_chain_and_a_zombie_stays_fenced,
            damage::broken_delta_chain_is_a_typed_error,
            damage::restore_at_a_delta_without_its_snapshot_is_an_error_not_an_empty_db,
            damage::a_delta_with_a_huge_db_size_is_corrupt_not_a_panic,
            damage::a_failed_apply_returns_without_waiting_for_the_next_fetch,
            retention::zombie_after_retention_is_fenced,
            retention::retention_keeps_the_delta_chain,
            retention::zombie_delta_is_fenced_and_collected,
            retention::a_zombie_delta_after_retention_never_lands,
            retention::a_zombie_is_fenced_by_its_create_without_a_list,
            retention::restore_newest_racing_retention_reads_again,
            pipeline::pipelined_ships_acknowledge_in_slot_order_whatever_order_they_land_in,
            pipeline::a_ship_that_never_lands_fences_its_writer_and_loses_nothing_acknowledged,
            pipeline::retention_keeps_a_blob_that_may_be_in_flight_below_the_head,
            levels::levels_restore_every_kept_moment_byte_for_byte,
            levels::a_level_file_put_that_fails_or_lands_unseen_loses_no_position,
            levels::a_compaction_racing_retention_leaves_no_level_file_behind,
            levels::a_damaged_level_file_thins_nothing_and_restores_from_the_log,
            levels::a_compaction_reads_only_the_segments_its_deltas_touch,
            levels::a_crafted_level_section_size_is_corrupt_not_an_abort,
            pipeline::a_stray_in_a_thinned_chain_goes_with_it_and_breaks_no_lookup,
            clone::a_clone_by_reference_restores_every_kept_position_byte_for_byte,
            clone::retention_keeps_what_a_clone_names_until_the_clone_lets_go,
            clone::a_clone_whose_snapshot_retention_retires_under_it_publishes_nothing,
            clone_attack::atk_a_clone_whose_entry_never_lands_leaves_no_state,
            clone_attack::atk_a_fenced_clone_leaves_no_reference,
            clone_attack::atk_a_zombie_clone_deletes_the_reference_of_the_clone_that_fenced_it,
            clone_attack::atk_an_interrupted_clone_retention_releases_its_reference_on_the_next_run,
            clone_attack::atk_a_clone_of_a_clone_costs_eight_puts_or_fewer,
            clone_attack::atk_verify_after_the_source_is_gone_and_crafted_references,
            journal::journal_batches_acknowledge_in_slot_order_and_read_back_one_org_each,
            journal::an_adopt_seal_fences_every_org_of_a_run_with_one_put,
            journal::an_exclusion_fences_one_org_and_the_run_keeps_acknowledging_the_rest,
            journal::a_failed_batch_ends_the_run_with_a_self_seal_that_walks_follow,
            journal::a_damaged_journal_object_is_a_typed_error,
            journal::a_dead_writers_acknowledged_state_restores_from_its_journal_byte_for_byte,
            journal::an_adopter_learns_every_org_from_the_newest_roster_back_along_self_seals,
            journal::run_retention_deletes_only_below_every_entry_and_keeps_fences,
            journal_log::a_walk_follows_claims_checkpoints_and_free_points_across_runs,
            journal_log::a_walk_over_damaged_journal_entries_is_a_typed_error,
            journal_claim::two_claimants_after_one_free_point_one_serves_and_the_other_walks_into_it,
            journal_claim::a_claim_with_an_entry_above_it_is_abandoned_and_walks_still_follow_it,
            journal_takeover::a_crash_takeover_adopts_every_org_with_one_seal_and_restores_each,
            journal_takeover::a_claim_over_a_live_run_excludes_one_org_and_the_run_keeps_the_rest,
            journal_takeover::a_checkpoint_whose_seq_is_taken_is_settled_by_a_walk,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_expand {
    ([suites] $($module:ident :: $name:ident),* $(,)?) => {
        /// Every case of the suite, in a stable order.
        pub const SUITES: &[Case] = &[$(Case {
            name: stringify!($name),
            run: |store| Box::pin($module::$name(store)),
        }),*];
    };
    ([tests $attrs:tt [$store:expr]] $($module:ident :: $name:ident),* $(,)?) => {
        $($crate::__conformance_expand!(@test $attrs [$store] $name);)*
    };
    (@test [$(#[$attr:meta])*] [$store:expr] $name:ident) => {
        $(#[$attr])*
        #[test]
        fn $name() -> $crate::conformance::CaseResult {
            $crate::conformance::run(stringify!($name), || $store)
        }
    };
}

__conformance_cases!(suites);

/// Expands one `#[test]` per case of the suite, each running on the store the first
/// argument builds (an expression of type `TestStore` or `Result<TestStore, _>`, evaluated
/// per test). Attributes after it (`#[ignore = "…"]`) go on every test. Invoke it inside a
/// module named for the backend:
///
/// ```text
/// mod on_s3 {
///     idem_replica::conformance_tests!(
///         idem_replica::conformance::TestStore::s3(),
///         #[ignore = "needs a loopback S3 server: run under scripts/s3-server"]
///     );
/// }
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($store:expr $(, #[$attr:meta])* $(,)?) => {
        $crate::__conformance_cases!(tests [$(#[$attr])*] [$store]);
    };
}

/// A store a case runs on, with whatever must live as long as it (a temp directory).
#[derive(Debug)]
pub struct TestStore {
    store: Arc<dyn ObjectStore>,
    _dir: Option<tempfile::TempDir>,
}

impl TestStore {
    /// A fresh `InMemory` store.
    pub fn memory() -> TestStore {
        Arc::new(object_store::memory::InMemory::new()).into()
    }

    /// A `LocalFileSystem` store in a fresh temp directory, removed when the store is
    /// dropped (built as [`Replica::local_store`] builds it, `with_fsync(true)`).
    ///
    /// # Errors
    /// When the directory or the store cannot be made.
    pub fn local() -> Result<TestStore, Error> {
        let dir = tempfile::tempdir().map_err(|e| Error::io(&std::env::temp_dir(), e))?;
        Ok(TestStore {
            store: Replica::local_store(dir.path())?,
            _dir: Some(dir),
        })
    }

    /// `inner` behind a [`FaultStore`](crate::testing::fault::FaultStore) with no rules: every call
    /// goes through the wrapper the fault cases use, and is counted.
    pub fn faulty(inner: TestStore) -> TestStore {
        TestStore {
            store: Arc::new(crate::testing::fault::FaultStore::new(inner.store)),
            _dir: inner._dir,
        }
    }

    /// The S3 API server named by [`S3_ENDPOINT_ENV`] ([`s3_store`]).
    ///
    /// # Panics
    /// When [`S3_ENDPOINT_ENV`] is not set: a test that did not run never passes.
    pub fn s3() -> TestStore {
        s3_store().into()
    }

    /// The Azurite server named by [`AZURE_ENDPOINT_ENV`] ([`azure_store`]).
    ///
    /// # Panics
    /// When [`AZURE_ENDPOINT_ENV`] is not set: a test that did not run never passes.
    pub fn azure() -> TestStore {
        azure_store().into()
    }

    /// The fake-gcs-server named by [`GCS_ENDPOINT_ENV`] ([`gcs_store`]). The probe refuses
    /// fake-gcs-server 1.54.0 (it takes no XML API upload), so no suite runs on it today; a
    /// GCS server that enforces `x-goog-if-generation-match` would run the suite with this.
    ///
    /// # Panics
    /// When [`GCS_ENDPOINT_ENV`] is not set: a test that did not run never passes.
    pub fn gcs() -> TestStore {
        gcs_store(GCS_ENDPOINT_ENV).into()
    }

    /// The store.
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }
}

impl From<Arc<dyn ObjectStore>> for TestStore {
    fn from(store: Arc<dyn ObjectStore>) -> Self {
        TestStore { store, _dir: None }
    }
}

impl From<Arc<object_store::memory::InMemory>> for TestStore {
    fn from(store: Arc<object_store::memory::InMemory>) -> Self {
        TestStore { store, _dir: None }
    }
}

/// Runs the case `name` of [`SUITES`] on the store `make` builds, on a two-worker tokio
/// runtime of its own. What each generated test calls.
///
/// # Errors
/// The case's error; an unknown name; a store or runtime that cannot be built.
pub fn run<S, E>(name: &str, make: impl FnOnce() -> S) -> CaseResult
where
    S: IntoTestStore<E>,
    E: std::error::Error + Send + Sync + 'static,
{
    let case = SUITES
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| format!("no conformance case named {name}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let store = make().into_test_store()?;
    runtime.block_on((case.run)(store.store()))
}

/// What [`conformance_tests!`](crate::conformance_tests) accepts as a store: a
/// [`TestStore`], or a `Result` of one.
pub trait IntoTestStore<E> {
    /// The store, or why it could not be built.
    ///
    /// # Errors
    /// The builder's error.
    fn into_test_store(self) -> Result<TestStore, E>;
}

impl IntoTestStore<std::convert::Infallible> for TestStore {
    fn into_test_store(self) -> Result<TestStore, std::convert::Infallible> {
        Ok(self)
    }
}

impl<E> IntoTestStore<E> for Result<TestStore, E> {
    fn into_test_store(self) -> Result<TestStore, E> {
        self
    }
}

/// A test server's store as its builder made it, or [`Error::Store`] naming `what` (the URL
/// and endpoint) when the builder refused its settings.
fn built<S: ObjectStore>(
    built: object_store::Result<S>,
    what: impl FnOnce() -> String,
) -> Result<Option<Arc<dyn ObjectStore>>, Error> {
    match built {
        Ok(store) => Ok(Some(Arc::new(store))),
        Err(source) => Err(Error::Store {
            op: "build",
            path: what(),
            source,
        }),
    }
}

/// The store a test server's builder made, for a test that needs it.
///
/// # Panics
/// When the server's variable `env` is unset (`built` is `Ok(None)`) or the store cannot be
/// built: a test that did not run must not count as passed.
fn required(
    server: &str,
    env: &str,
    script: &str,
    built: Result<Option<Arc<dyn ObjectStore>>, Error>,
) -> Arc<dyn ObjectStore> {
    match built {
        Ok(Some(store)) => store,
        Ok(None) => panic!(
            "{env} is not set: this test needs {server}; run it under {script} \
             ({script} -- cargo test -- --include-ignored)"
        ),
        Err(e) => panic!("building the test store for {server}: {e}"),
    }
}

/// A fresh random prefix: one case's objects never meet another's in a shared bucket.
fn prefix() -> Result<String, Error> {
    Ok(format!("conf-{}", &new_nonce()?[..12]))
}

fn org(s: &str) -> OrgId {
    match OrgId::new(s) {
        Ok(o) => o,
        Err(e) => panic!("test org id {s:?}: {e}"),
    }
}

/// A small SQLite image with `rows` rows in table `t`, commit counter = `rows`.
///
/// # Errors
/// [`Error::Sqlite`].
pub fn test_snapshot(rows: u64) -> Result<Snapshot, Error> {
    let sql = |source| Error::Sqlite {
        op: "building a test snapshot",
        source,
    };
    let conn = rusqlite::Connection::open_in_memory().map_err(sql)?;
    conn.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
        .map_err(sql)?;
    for i in 0..rows {
        conn.execute(
            "INSERT INTO t(id, v) VALUES (?1, ?2)",
            rusqlite::params![i as i64, format!("row-{i}")],
        )
        .map_err(sql)?;
    }
    Snapshot::take(&conn, |c| {
        c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
    })
}

/// Rows in table `t` of the database file at `path`.
fn rows_in(path: &std::path::Path) -> rusqlite::Result<u64> {
    let conn = rusqlite::Connection::open(path)?;
    let n: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
    Ok(n as u64)
}

async fn open(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<Replica, Error> {
    Replica::open(store, prefix, Settings::default()).await
}

/// The object path of log entry `seq` of org `acme` under `prefix`.
fn log_path(prefix: &str, seq: u64) -> object_store::path::Path {
    object_store::path::Path::from(format!("{prefix}/orgs/acme/log/{seq:020}.json"))
}
