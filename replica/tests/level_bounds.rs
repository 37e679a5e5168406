//! A chain too large for a level file (`MAX_LEVEL_BYTES`, `docs/design.md` 2d) is refused
//! before its pages are downloaded or held (I14), and a handle does not rebuild it again on
//! every run (found by an adversarial review: the bound was checked only after a batch of
//! deltas had been applied and sectioned, and nothing remembered the verdict).
//!
//! The chain: an ~80 MiB database and four deltas in one bucket, each flipping the last
//! byte of every page (a few bytes per page once encoded), so its pages, whole, pass the
//! bound though the deltas are small.

use std::collections::BTreeMap;
use std::sync::Arc;

use idem_replica::{
    Clock, Delta, MAX_LEVEL_BYTES, ManualClock, OrgId, Replica, Retention, Settings, Snapshot,
    SystemClock,
};
use object_store::ObjectStore;
use rusqlite::{Connection, MAIN_DB};

const PS: usize = 4096;

#[test]
fn a_chain_too_large_for_a_level_file_is_refused_before_its_pages_are_read_and_only_once()
-> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let now = SystemClock.now_ms();
        let clock = Arc::new(ManualClock::new(now - 3 * 3_600_000));
        let r = Replica::open_with(store, "atk", Settings::default(), clock.clone(), None).await?;
        let org = OrgId::new("acme")?;
        let mut claim = r.claim(&org, "a", false).await?;
        let mut image = {
            let mut conn = Connection::open_in_memory()?;
            conn.execute_batch(
                "PRAGMA page_size = 4096; CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB);
                 WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 20000)
                 INSERT INTO t SELECT i, zeroblob(3900) FROM c",
            )?;
            conn.serialize(MAIN_DB)?.to_vec()
        };
        let pages = (image.len() / PS) as u32;
        assert!(
            image.len() as u64 > MAX_LEVEL_BYTES + (8 << 20),
            "{}",
            image.len()
        );
        let mut commit = 1;
        r.ship(&mut claim, Snapshot::from_bytes(image.clone(), commit))
            .await?;
        // Four deltas in one bucket, each flipping the last byte of every page but the
        // first: a few bytes per page once encoded against the previous content.
        for i in 0..4u8 {
            clock.advance(1_000);
            let prev = image.clone();
            let mut changed = BTreeMap::new();
            for p in 2..=pages {
                let end = p as usize * PS - 1;
                image[end] ^= i + 1;
                changed.insert(p, image[end + 1 - PS..=end].to_vec());
            }
            commit += 1;
            let delta = Delta::new(PS as u32, pages, changed, commit)?
                .encode_against(|p| prev.get((p as usize - 1) * PS..p as usize * PS));
            r.ship_delta(&mut claim, delta).await?;
        }
        clock.advance(1_000);
        commit += 1;
        r.ship(&mut claim, Snapshot::from_bytes(image.clone(), commit))
            .await?;
        drop(image);
        let policy = Retention {
            keep_snapshots: 1,
            keep_ms: 3_600_000,
            window_ms: idem_replica::DEFAULT_WINDOW_MS,
            level_ms: 60_000,
        };
        // The first run reads the chain's deltas (inline in their entries) and the
        // snapshot's manifest, then refuses: no segment of the 80 MiB snapshot.
        let before = r.store_requests();
        let first = r.compact_levels(&org, &policy).await?;
        let gets = r.store_requests().since(&before).get;
        assert!(first.written.is_empty(), "{first:?}");
        assert_eq!(first.skipped.len(), 1, "{first:?}");
        assert_eq!(first.skipped[0].1, "sections too large");
        assert!(gets <= 8, "the refused compaction read {gets} objects");
        // The same handle does not rebuild it again.
        let before = r.store_requests();
        let second = r.compact_levels(&org, &policy).await?;
        let gets = r.store_requests().since(&before).get;
        assert_eq!(gets, 0, "the second run read {gets} objects: {second:?}");
        Ok(())
    })
}
