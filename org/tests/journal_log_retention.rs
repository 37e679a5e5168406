//! T4 (`docs/design.md` 3g, "T4 as built"): retention of a journal org's log deletes its
//! older checkpoints and their objects, never what K0 reads or a kept position is rebuilt
//! from; the holder keeps acknowledging on top, and a successor replays every key. The
//! registry runs it after snapshot checkpoints, so the log stays short.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{R, effect, published, registry, replica_with_lease};
use futures::TryStreamExt;
use idem_org::{JournalSettings, Registry, RegistrySettings};
use idem_replica::{OrgId, Replica, Retention};
use object_store::ObjectStore;
use object_store::memory::InMemory;

const LEASE_MS: u64 = 1_000;
const PADDING: &str = "acme-16-bytes-..";

/// Checkpoints every few acknowledgements, a snapshot every third; the registry retains
/// after every snapshot checkpoint when `retain` is set, with nothing kept for its age.
fn settings(retain: bool) -> RegistrySettings {
    let mut s = RegistrySettings {
        journal: JournalSettings {
            enabled: true,
            section_bytes: 8 << 10,
            max_chain_deltas: 2,
            ..JournalSettings::default()
        },
        ..RegistrySettings::default()
    };
    s.retain_every_ships = u64::from(retain);
    s.retain_interval_ms = 0;
    s.retention = aggressive();
    s
}

fn aggressive() -> Retention {
    Retention {
        keep_snapshots: 1,
        keep_ms: 0,
        ..Retention::default()
    }
}

/// The objects of `org`'s `snap/` (blobs, manifests, segments).
async fn snap_objects(
    store: &Arc<dyn ObjectStore>,
    org: &str,
) -> Result<Vec<String>, common::BoxErr> {
    let listed: Vec<_> = store.list(None).try_collect().await?;
    let dir = format!("orgs/{org}/snap/");
    Ok(listed
        .into_iter()
        .map(|m| m.location.to_string())
        .filter(|p| p.contains(&dir))
        .collect())
}

/// Every stored entry of `org`'s log restored (`restore --at`), by seq.
async fn positions(
    replica: &Replica,
    org: &OrgId,
    dir: &std::path::Path,
) -> Result<BTreeMap<u64, Vec<u8>>, common::BoxErr> {
    let mut out = BTreeMap::new();
    for e in replica.journal_history(org).await? {
        if e.stored().is_none() {
            continue;
        }
        let dest = dir.join(format!("at-{}.db", e.seq()));
        replica.restore(org, Some(e.seq()), &dest).await?;
        out.insert(e.seq(), std::fs::read(&dest)?);
    }
    Ok(out)
}

async fn newest(
    replica: &Replica,
    org: &OrgId,
    dir: &std::path::Path,
) -> Result<Vec<u8>, common::BoxErr> {
    let dest = dir.join("newest.db");
    let _ = std::fs::remove_file(&dest);
    replica.restore(org, None, &dest).await?;
    Ok(std::fs::read(&dest)?)
}

async fn acknowledge(reg: &Registry, keys: &[String]) -> R {
    let acme = OrgId::new("acme")?;
    for key in keys {
        // 16 KiB a row: snapshots and most deltas are objects, not inline.
        let out = reg
            .once(&acme, key, effect(&PADDING.repeat(1 << 10), key))
            .await?;
        assert!(out.applied, "{key} did not apply");
    }
    Ok(())
}

/// A retention run from another handle, under a live holder: young entries all stay; with
/// nothing kept for its age, older checkpoints and their objects go, every kept position
/// restores byte for byte as before, the newest state is unchanged, and the holder goes on
/// acknowledging on top of what stayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_every_kept_position_and_the_holder_builds_on_it() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", settings(false))?;
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    acknowledge(&a, &keys).await?;
    let acme = OrgId::new("acme")?;
    let before = positions(&ra, &acme, dir.path()).await?;
    let newest_before = newest(&ra, &acme, dir.path()).await?;
    let snap_before = snap_objects(&store, "acme").await?;
    assert!(before.len() > 6, "too few checkpoints to judge: {before:?}");

    let cron = replica_with_lease(store.clone(), LEASE_MS).await?;
    let young = cron.retain(&acme, &Retention::default()).await?;
    assert!(young.deleted_entries.is_empty(), "{young:?}");
    let report = cron.retain(&acme, &aggressive()).await?;
    assert!(
        report.deleted_entries.len() >= before.len() - 4,
        "{report:?} of {:?}",
        before.keys()
    );
    let after = positions(&ra, &acme, dir.path()).await?;
    for (seq, bytes) in &after {
        assert!(before.get(seq) == Some(bytes), "{seq} restores otherwise");
    }
    for seq in &report.deleted_entries {
        assert!(!after.contains_key(seq), "{seq} deleted but listed");
        let dest = dir.path().join(format!("gone-{seq}.db"));
        assert!(ra.restore(&acme, Some(*seq), &dest).await.is_err());
    }
    assert_eq!(newest(&ra, &acme, dir.path()).await?, newest_before);
    let snap_after = snap_objects(&store, "acme").await?;
    assert!(
        snap_after.len() < snap_before.len(),
        "no object went: {snap_after:?}"
    );
    assert!(snap_after.iter().all(|o| snap_before.contains(o)));
    let verified = ra.verify(&acme).await?;
    assert!(verified.failed.is_empty(), "{:?}", verified.failed);

    let more: Vec<String> = (40..70).map(|i| format!("k{i}")).collect();
    acknowledge(&a, &more).await?;
    let (effects, applied) = published(&ra, "acme", dir.path()).await?;
    assert_eq!(applied, 70, "{effects:?}");
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    let verified = ra.verify(&acme).await?;
    assert!(verified.failed.is_empty(), "{:?}", verified.failed);
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    let all: Vec<String> = keys.into_iter().chain(more).collect();
    common::journal::successor_replays(store, &all, settings(false)).await
}

/// The registry retains a journal org's log after its snapshot checkpoints: after many
/// checkpoints the log holds a handful of entries, and a successor replays every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_keeps_a_journal_orgs_log_short() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let a = registry(&dir.path().join("a"), ra.clone(), "wa", settings(true))?;
    let keys: Vec<String> = (0..60).map(|i| format!("k{i}")).collect();
    acknowledge(&a, &keys).await?;
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    let acme = OrgId::new("acme")?;
    let log = ra.journal_history(&acme).await?;
    let head = log.last().map_or(0, |e| e.seq());
    // Between two runs at most a snapshot and its two deltas land above what one keeps
    // (the claim, the newest snapshot and the chain the newest section names).
    assert!(
        head > 16 && log.len() <= 8,
        "{} entries of {head}: {:?}",
        log.len(),
        log.iter().map(|e| e.seq()).collect::<Vec<_>>()
    );
    let verified = ra.verify(&acme).await?;
    assert!(verified.failed.is_empty(), "{:?}", verified.failed);
    common::journal::successor_replays(store, &keys, settings(false)).await
}
