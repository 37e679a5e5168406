//! How a journal tenure captures (`docs/design.md` 3g, "The org layer on the journal"): after
//! its first capture, each ship reads only the WAL's committed frames since the previous
//! one and checkpoints the WAL only past `JournalSettings::wal_checkpoint_bytes`; what the store
//! holds after every acknowledgement is exactly what was acknowledged, across the WAL
//! restarts those checkpoints make, and a successor replays every key.

mod common;

use std::sync::Arc;

use common::{R, effect, published, registry, replica_with_lease};
use idem_org::{JournalSettings, Registry, RegistrySettings};
use idem_replica::{OrgId, Replica};
use object_store::ObjectStore;
use object_store::memory::InMemory;

const LEASE_MS: u64 = 1_000;

fn journal(wal_checkpoint_bytes: u64) -> RegistrySettings {
    let mut settings = RegistrySettings {
        journal: JournalSettings {
            enabled: true,
            // A few acknowledgements per J5 checkpoint: sections restart from checkpoints
            // while the WAL position carries on.
            section_bytes: 24 << 10,
            ..JournalSettings::default()
        },
        ..RegistrySettings::default()
    };
    settings.journal.wal_checkpoint_bytes = wal_checkpoint_bytes;
    settings
}

fn wal_len(data: &std::path::Path) -> Result<u64, common::BoxErr> {
    let db = common::outside::served_db(data)?;
    let mut wal = db.into_os_string();
    wal.push("-wal");
    Ok(std::fs::metadata(&wal).map_or(0, |m| m.len()))
}

/// Acknowledges `keys` one after another on org `acme`, and after each checks that the
/// store holds every key acknowledged so far exactly once; returns the WAL's length after
/// each acknowledgement.
async fn acknowledge(
    reg: &Registry,
    replica: &Replica,
    data: &std::path::Path,
    keys: &[String],
) -> Result<Vec<u64>, common::BoxErr> {
    let acme = OrgId::new("acme")?;
    let check = tempfile::tempdir()?;
    let mut lens = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let out = reg.once(&acme, key, effect("acme", key)).await?;
        assert!(out.applied, "{key} did not apply");
        lens.push(wal_len(data)?);
        let (effects, applied) = published(replica, "acme", check.path()).await?;
        assert_eq!(applied, i as i64 + 1, "after {key}: {effects:?}");
        for k in &keys[..=i] {
            assert_eq!(effects.get(k), Some(&1), "after {key}: {k} in {effects:?}");
        }
    }
    Ok(lens)
}

/// With a bound of 4 MiB no ship checkpoints the WAL: the frames of every
/// acknowledged commit stay in it and the WAL only grows, while the store follows each
/// acknowledgement. (A ship that checkpointed would leave the WAL empty after its ack.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ships_read_wal_frames_without_a_checkpoint_each() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let data = dir.path().join("a");
    let a = registry(&data, ra.clone(), "wa", journal(4 << 20))?;
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    let lens = acknowledge(&a, &ra, &data, &keys).await?;
    // The tenure's first capture checkpoints (it diffs the file the open path wrote);
    // every later one leaves the frames where they are.
    assert!(
        lens[1..].windows(2).all(|w| w[1] > w[0]),
        "the WAL was checkpointed by a ship: {lens:?}"
    );
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    common::journal::successor_replays(store, &keys, journal(4 << 20)).await
}

/// With a bound of 16 KiB the WAL is checkpointed and restarted every few ships; captures
/// read each new generation from its start, and neither a page nor a commit is lost or
/// invented across the restarts (the store holds exactly what was acknowledged after each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_restarts_between_ships_lose_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let data = dir.path().join("a");
    let a = registry(&data, ra.clone(), "wa", journal(16 << 10))?;
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let lens = acknowledge(&a, &ra, &data, &keys).await?;
    let restarts = lens[1..].windows(2).filter(|w| w[1] < w[0]).count();
    assert!(
        restarts >= 3,
        "the WAL was not restarted between ships: {lens:?}"
    );
    let report = ra.verify(&OrgId::new("acme")?).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    common::journal::successor_replays(store, &keys, journal(4 << 20)).await
}

/// The delta checkpoints from `org`'s newest stored entry down to a snapshot, by `base`
/// links, and the number of snapshot entries in its log.
async fn newest_chain(replica: &Replica, org: &OrgId) -> Result<(usize, usize), common::BoxErr> {
    let log = replica.journal_history(org).await?;
    let stored: std::collections::BTreeMap<u64, _> = log
        .iter()
        .filter(|e| e.stored().is_some())
        .map(|e| (e.seq(), e))
        .collect();
    let snapshots = stored.values().filter(|e| e.is_snapshot()).count();
    let mut at = *stored.keys().next_back().ok_or("no stored entry")?;
    let mut deltas = 0;
    while let Some(link) = stored.get(&at).ok_or("a base link to nothing")?.delta() {
        assert!(link.base < at, "a link that does not go down");
        deltas += 1;
        at = link.base;
    }
    Ok((deltas, snapshots))
}

/// J5's chain bound: with `max_chain_deltas` 2 and a checkpoint every couple of
/// acknowledgements, every third checkpoint is a snapshot read from the file (which holds
/// exactly the acknowledged state), so the newest checkpoint is never more than 2 deltas
/// above a snapshot; `verify` rebuilds every entry and a successor hydrates and replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_chains_end_in_a_snapshot_within_the_bound() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let data = dir.path().join("a");
    let mut settings = journal(4 << 20);
    settings.journal.max_chain_deltas = 2;
    let a = registry(&data, ra.clone(), "wa", settings)?;
    let acme = OrgId::new("acme")?;
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let mut longest = 0;
    for chunk in keys.chunks(4) {
        acknowledge_more(&a, chunk).await?;
        let (deltas, _) = newest_chain(&ra, &acme).await?;
        longest = longest.max(deltas);
    }
    let (_, snapshots) = newest_chain(&ra, &acme).await?;
    assert!(longest <= 2, "a chain of {longest} deltas");
    assert!(
        snapshots >= 3,
        "{snapshots} snapshots: the chain was never cut"
    );
    let report = ra.verify(&acme).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    common::journal::successor_replays(store, &keys, journal(4 << 20)).await
}

/// Acknowledges `keys` on `acme`, each writing an effect row of 6,000 bytes: about two new
/// pages a commit, so the cumulative section passes `section_bytes` (24 KiB) every few.
async fn acknowledge_more(reg: &Registry, keys: &[String]) -> R {
    let acme = OrgId::new("acme")?;
    for key in keys {
        let k = key.clone();
        let wide = move |tx: &rusqlite::Transaction<'_>| {
            tx.execute(
                "INSERT INTO effects (key, org) VALUES (?1, ?2)",
                [&k, &"x".repeat(6_000)],
            )?;
            Ok::<_, rusqlite::Error>(k.clone().into_bytes())
        };
        let out = reg.once(&acme, key, wide).await?;
        assert!(out.applied, "{key} did not apply");
    }
    Ok(())
}
