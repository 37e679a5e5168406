//! Retention by age asks the store's clock before it deletes (I15): the host's clock is a
//! `ManualClock`, the store's is whatever stamps Last-Modified (the kernel's real time on a
//! local directory, the server's on S3), so a manual clock days away from the real time is a
//! skewed host.

use std::sync::Arc;

use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::{CaseResult, org, prefix, test_snapshot};
use crate::format::layout::{delta_blob_name, new_nonce};
use crate::{Clock, LogEntry, ManualClock, Replica, Retention, Settings, SystemClock};

const MINUTE_MS: u64 = 60_000;

/// Regression: retention on a host whose clock stepped days forward deleted every snapshot
/// beyond the count, though by the store's clock they were seconds old; and then, refusing,
/// it deleted nothing at all, orphans included, so the store only grew.
pub(super) async fn retention_on_a_skewed_host_deletes_nothing_by_age(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    // Snapshots stamped by a host a minute behind the store, a second apart.
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms() - MINUTE_MS));
    let settings = Settings::default();
    let r = Replica::open_with(store.clone(), &prefix()?, settings, clock.clone(), None).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    for i in 0..4 {
        r.ship(&mut a, test_snapshot(i + 1)?).await?;
        clock.advance(1_000);
    }
    let seqs = |log: Vec<LogEntry>| log.iter().map(LogEntry::seq).collect::<Vec<_>>();
    let before = seqs(r.history(&o).await?);
    let policy = |keep_ms| Retention {
        keep_snapshots: 1,
        keep_ms,
        window_ms: 0,
        level_ms: 0,
    };

    // An orphan: a blob named for a position the log has reached that no entry names (a
    // fenced writer's upload). Its deletion does not depend on anyone's clock.
    let orphan = r
        .inner
        .store
        .layout
        .blob(&o, &delta_blob_name(a.seq(), a.round(), &new_nonce()?));
    store
        .put(&orphan, PutPayload::from_static(b"orphan"))
        .await?;

    // Days ahead: no snapshot deleted by age, but the orphan still goes (a skewed host's
    // store must not only grow).
    clock.set(SystemClock.now_ms() + 8 * 1440 * MINUTE_MS);
    let skipped = r.retain(&o, &policy(MINUTE_MS)).await?;
    assert!(skipped.age_skipped, "{skipped:?}");
    assert_eq!(skipped.kept_snapshots, 4, "{skipped:?}");
    assert!(skipped.deleted_entries.is_empty(), "{skipped:?}");
    assert_eq!(skipped.deleted_blobs, [orphan.to_string()], "{skipped:?}");
    assert!(matches!(
        store.head(&orphan).await,
        Err(object_store::Error::NotFound { .. })
    ));
    assert_eq!(seqs(r.history(&o).await?), before);
    // Days behind: by this host nothing is old, so nothing is deleted and nothing asked.
    clock.set(SystemClock.now_ms() - 8 * 1440 * MINUTE_MS);
    let young = r.retain(&o, &policy(MINUTE_MS)).await?;
    assert_eq!(young.kept_snapshots, 4, "{young:?}");
    assert_eq!(seqs(r.history(&o).await?), before);

    // Four minutes ahead (within the bound): by this host the snapshots are five minutes
    // old, by the store about one; a three-minute window keeps them all.
    clock.set(SystemClock.now_ms() + 4 * MINUTE_MS);
    let kept = r.retain(&o, &policy(3 * MINUTE_MS)).await?;
    assert_eq!(kept.kept_snapshots, 4, "{kept:?}");
    assert_eq!(seqs(r.history(&o).await?), before);

    // A host that agrees with the store deletes by age as before.
    clock.set(SystemClock.now_ms());
    let report = r.retain(&o, &policy(30_000)).await?;
    assert_eq!(report.kept_snapshots, 1, "{report:?}");
    assert_eq!(report.deleted_entries, before[1..4].to_vec(), "{report:?}");
    Ok(())
}
