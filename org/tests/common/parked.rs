//! Parked journal orgs (`journal_park.rs`, `journal_park_attack.rs`): a journal registry on
//! an in-memory store with few active orgs, and `acme` parked by a request of `other`.

use std::path::PathBuf;
use std::sync::Arc;

use idem_org::{Org, Registry, RegistrySettings};
use idem_replica::{OrgId, Replica};
use object_store::ObjectStore;
use object_store::memory::InMemory;

use super::journal::{LEASE_MS, settings};
use super::{BoxErr, R, effect, registry, replica_with_lease};

/// A journal registry (writer `wa`) with its data directory, store and replica.
pub struct World {
    pub dir: tempfile::TempDir,
    pub store: Arc<dyn ObjectStore>,
    pub replica: Replica,
    pub reg: Registry,
}

/// Journal settings (16 KiB sections) with `active` active orgs.
pub fn active(active: usize) -> RegistrySettings {
    RegistrySettings {
        max_active_orgs: active,
        ..settings(16 * 1024)
    }
}

/// A [`World`] whose registry runs with `s`.
pub async fn world_with(s: RegistrySettings) -> Result<World, BoxErr> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let replica = replica_with_lease(store.clone(), LEASE_MS).await?;
    let reg = registry(&dir.path().join("data"), replica.clone(), "wa", s)?;
    Ok(World {
        dir,
        store,
        replica,
        reg,
    })
}

/// An application hook that writes at every open: the ledger's schema, then a row in
/// `opens`, outside any request's commit.
pub fn writing_hook(c: &rusqlite::Connection) -> rusqlite::Result<()> {
    c.execute_batch(super::LEDGER)?;
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS opens (n INTEGER PRIMARY KEY);
         INSERT INTO opens DEFAULT VALUES;",
    )
}

/// A [`World`] with [`active`]`(1)` whose application hook writes at every open (a row in
/// `opens`), outside any request's commit.
pub async fn world_with_writing_hook() -> Result<World, BoxErr> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let replica = replica_with_lease(store.clone(), LEASE_MS).await?;
    let reg = Registry::builder(dir.path().join("data"), replica.clone(), "wa")
        .settings(active(1))
        .on_open(writing_hook)
        .build()?;
    Ok(World {
        dir,
        store,
        replica,
        reg,
    })
}

/// Org `acme`.
pub fn acme() -> Result<OrgId, BoxErr> {
    Ok(OrgId::new("acme")?)
}

/// `names` as owned keys.
pub fn keys(names: &[&str]) -> Vec<String> {
    names.iter().map(|k| (*k).to_owned()).collect()
}

/// The database file `acme` is served from.
pub fn acme_db(w: &World) -> Result<PathBuf, BoxErr> {
    super::outside::served_db(&w.dir.path().join("data"))
}

/// Numbers `other`'s keys, so every request of [`park_acme`] is a first run.
static PARK_KEYS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Parks `acme` (idle) by first runs on `other`, which takes the one active slot
/// ([`park_through`]).
pub async fn park_acme(w: &World, a_org: &Org) -> R {
    park_through(&w.reg, a_org, &OrgId::new("other")?).await
}

/// Parks `org` (idle) by first runs on `other` through `reg`, with one active slot. A park
/// is skipped while a pool worker has not yet let go of `org` after its last reply
/// (`park::a_park_never_waits_for_a_worker_running_an_abandoned_job`), so this asks again
/// until `org` is parked: a wait for a state, at most 50 requests. Fails when `org` was
/// parked already, or never parks, or parked more than once.
pub async fn park_through(reg: &Registry, org: &Org, other: &OrgId) -> R {
    assert!(!org.is_parked());
    let parks = org.stats().parks;
    for i in 0..50 {
        let n = PARK_KEYS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = format!("x{parks}-{i}-{n}");
        let out = reg.once(other, &key, effect(other.as_str(), &key)).await?;
        assert!(out.applied);
        if org.is_parked() {
            assert_eq!(org.stats().parks, parks + 1);
            return Ok(());
        }
    }
    Err(format!("{} never parked", org.id()).into())
}

/// `acme` served `names`, then parked ([`park_acme`]).
pub async fn parked_acme(w: &World, names: &[&str]) -> Result<Org, BoxErr> {
    let a_org = w.reg.acquire(&acme()?).await?;
    for key in names {
        assert!(a_org.once(key, effect("acme", key)).await?.applied);
    }
    park_acme(w, &a_org).await?;
    Ok(a_org)
}
