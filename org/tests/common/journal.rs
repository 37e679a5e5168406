//! The org layer on the journal (`journal.rs`, `journal_attack.rs`): registry settings with
//! the journal on, numbered orgs, retries of retryable errors, replays, and what the store
//! must hold of an org.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem_org::{Error, ErrorKind, JournalSettings, Registry, RegistrySettings};
use idem_replica::latency::{LatencyStore, Shape, Shapes};
use idem_replica::{OrgId, Replica};
use object_store::ObjectStore;
use object_store::memory::InMemory;

use super::{BoxErr, R, effect, oracle, published};

/// The process lease of every replica of these tests.
pub const LEASE_MS: u64 = 1_000;

/// How long [`retry`] retries a retryable error.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// Registry settings with the journal on, each org checkpointing (J5) once its sections
/// reach `section_bytes`.
pub fn settings(section_bytes: u64) -> RegistrySettings {
    RegistrySettings {
        journal: JournalSettings {
            enabled: true,
            section_bytes,
            ..JournalSettings::default()
        },
        ..RegistrySettings::default()
    }
}

/// An in-memory store whose every request takes `latency` (`seed`: the latency shapes').
pub fn slow_store(latency: Duration, seed: u64) -> Arc<dyn ObjectStore> {
    let shapes = Shapes::all(Shape::Constant(latency));
    Arc::new(LatencyStore::new(Arc::new(InMemory::new()), shapes, seed))
}

/// Org `org{i}`.
pub fn org(i: usize) -> OrgId {
    OrgId::new(&format!("org{i}")).expect("valid org id")
}

/// Keys `k0..k{rounds}`.
pub fn keys(rounds: usize) -> Vec<String> {
    (0..rounds).map(|r| format!("k{r}")).collect()
}

/// Calls `f` until it returns anything but a retryable error, for at most [`PATIENCE`].
pub async fn retry<T, F, Fut>(f: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    retry_within(PATIENCE, f).await
}

/// Calls `f` until it returns anything but a retryable error, for at most `patience` (zero:
/// `f`'s first answer, whatever it is).
pub async fn retry_within<T, F, Fut>(patience: Duration, mut f: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let waited = idem_base::Stopwatch::start();
    loop {
        match f().await {
            Err(e) if e.kind() == ErrorKind::Retry && waited.elapsed() < patience => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
}

/// Every key of `keys` replays in `o` on `reg` with its first result, never applied again;
/// each call retried while retryable (see [`retry`]).
pub async fn replays(reg: &Registry, o: &OrgId, keys: &[String]) -> R {
    replays_within(PATIENCE, reg, o, keys).await
}

/// A successor registry (writer `wb`, fresh data directory, `settings`) on `store` replays
/// every key of `keys` in org `acme` without applying it again, then shuts down cleanly.
pub async fn successor_replays(
    store: Arc<dyn ObjectStore>,
    keys: &[String],
    settings: RegistrySettings,
) -> R {
    let dir = tempfile::tempdir()?;
    let rb = super::replica_with_lease(store, LEASE_MS).await?;
    let b = super::registry(dir.path(), rb, "wb", settings)?;
    replays(&b, &OrgId::new("acme")?, keys).await?;
    let results = b.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    Ok(())
}

/// [`replays`], each call retried for at most `patience` (zero: its first answer).
pub async fn replays_within(patience: Duration, reg: &Registry, o: &OrgId, keys: &[String]) -> R {
    for key in keys {
        let out = retry_within(patience, || {
            reg.once(o, key, effect(o.as_str(), "ran-again"))
        })
        .await?;
        assert!(!out.applied, "{o} {key} applied twice");
        assert_eq!(out.result, key.as_bytes(), "{o} {key}");
    }
    Ok(())
}

/// The store's newest state of `o`, restored under `dir`, holds the counts of the
/// exactly-once oracle ([`oracle::each_once`]): every key of `acked` applied once, no effect
/// twice, one key row per effect, nothing of `forbidden`. Returns its effects per key.
pub async fn in_store(
    replica: &Replica,
    dir: &Path,
    o: &OrgId,
    acked: &[String],
    forbidden: &[&str],
) -> Result<BTreeMap<String, i64>, BoxErr> {
    let (effects, applied_keys) = published(replica, o.as_str(), dir).await?;
    oracle::each_once(o.as_str(), &effects, applied_keys, acked, forbidden);
    Ok(effects)
}
