//! Pipelined ships (`docs/design.md` 3e): ships landing out of order acknowledge in slot
//! order only; a ship that never lands loses nothing and fences its writer; a successor
//! claims where the writer's next create goes, skips its strays, and every reader agrees
//! (I6, I7, I10, I11).

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::db::{Db, diff};
use super::{CaseResult, org, prefix};
use crate::format::layout::{delta_blob_name, new_nonce};
use crate::{Acked, Error, Landing, Replica, Retention, Settings, Snapshot};

async fn pipelined(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<Replica, Error> {
    let settings = Settings {
        ship_window: 4,
        ..Settings::default()
    };
    Replica::open(store, prefix, settings).await
}

const STEPS: [&str; 3] = [
    "INSERT INTO t VALUES (100, randomblob(2000))",
    "UPDATE t SET v = randomblob(10) WHERE id % 3 = 0",
    "CREATE TABLE u(k TEXT PRIMARY KEY); INSERT INTO u VALUES ('a')",
];

/// A database of 20 rows and its image, then the images after each of [`STEPS`].
fn images() -> Result<Vec<Vec<u8>>, Box<dyn std::error::Error + Send + Sync>> {
    let mut db = Db::new()?;
    db.exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 20) INSERT INTO t SELECT i, randomblob(300) FROM n")?;
    let mut out = vec![db.image()?];
    for step in STEPS {
        db.exec(step)?;
        out.push(db.image()?);
    }
    Ok(out)
}

/// Two ships in flight land in reverse order: nothing is acknowledged until both have, then
/// both at once; the next ship is based on the newest landed one. A successor hydrates the
/// last state, every landed position restores byte for byte, and verify passes.
pub(super) async fn pipelined_ships_acknowledge_in_slot_order_whatever_order_they_land_in(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let r = pipelined(store.clone(), &p).await?;
    let acme = org("acme");
    let img = images()?;
    let mut a = r.claim(&acme, "a", false).await?;
    assert_eq!(a.ship_window(), 4);
    let s = r
        .ship(&mut a, Snapshot::from_bytes(img[0].clone(), 1))
        .await?;
    // Both based on the snapshot: the second holds the first's pages too (W1).
    let first = r.issue_delta(&mut a, diff(&img[0], &img[1], 2)?).await?;
    let second = r.issue_delta(&mut a, diff(&img[0], &img[2], 3)?).await?;
    assert_eq!((first.seq(), second.seq()), (s.seq + 1, s.seq + 2));
    let landed = r.land(&second).await;
    assert!(matches!(landed, Landing::Landed), "{landed:?}");
    assert_eq!(
        r.settle(&mut a, second, landed)?,
        None,
        "acked past a ship in flight"
    );
    // The window is a span of slots from the lowest unresolved one, not a count: with the
    // first in flight and the second landed, two more fit (slots s+3, s+4) and a fifth
    // would be beyond the strays' range a successor at s+1 covers (R1).
    let third = r.issue_delta(&mut a, diff(&img[0], &img[2], 3)?).await?;
    let fourth = r.issue_delta(&mut a, diff(&img[0], &img[2], 3)?).await?;
    assert_eq!(fourth.seq(), s.seq + 4);
    assert!(matches!(
        r.issue_delta(&mut a, diff(&img[0], &img[2], 3)?).await,
        Err(Error::InvalidSettings { .. })
    ));
    for ship in [third, fourth] {
        let landed = r.land(&ship).await;
        assert_eq!(r.settle(&mut a, ship, landed)?, None);
    }
    let landed = r.land(&first).await;
    assert_eq!(
        r.settle(&mut a, first, landed)?,
        Some(Acked {
            seq: s.seq + 4,
            commit: 3
        })
    );
    let third = r.issue_delta(&mut a, diff(&img[2], &img[3], 4)?).await?;
    let landed = r.land(&third).await;
    assert_eq!(r.settle(&mut a, third, landed)?.map(|a| a.commit), Some(4));
    r.release(&mut a).await?;

    let b_replica = Replica::open(store, &p, Settings::default()).await?;
    let mut b = b_replica.claim(&acme, "b", false).await?;
    let tmp = tempfile::tempdir()?;
    let h = b_replica.hydrate(&mut b, &tmp.path().join("db")).await?;
    assert_eq!((h.position, h.commit), (Some(s.seq + 5), 4));
    assert!(std::fs::read(tmp.path().join("db"))? == img[3]);
    for (seq, image) in [(s.seq, &img[0]), (s.seq + 1, &img[1]), (s.seq + 2, &img[2])] {
        let dest = tmp.path().join(format!("at-{seq}"));
        b_replica.restore(&acme, Some(seq), &dest).await?;
        assert!(std::fs::read(&dest)? == *image, "restore at {seq}");
    }
    let report = b_replica.verify(&acme).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    Ok(())
}

/// The writer dies with its first ship in flight and its second landed. The successor
/// claims at the first ship's slot (the floor of the landed one, C1), so the landed one is
/// a stray (R1): it hydrates the snapshot, nothing the writer could have acknowledged. The
/// first ship landing late collides and is fenced (I7); the successor's ship skips the
/// stray (W5), and every reader reads its chain.
pub(super) async fn a_ship_that_never_lands_fences_its_writer_and_loses_nothing_acknowledged(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let r = pipelined(store.clone(), &p).await?;
    let acme = org("acme");
    let img = images()?;
    let mut a = r.claim(&acme, "a", false).await?;
    let s = r
        .ship(&mut a, Snapshot::from_bytes(img[0].clone(), 1))
        .await?;
    let first = r.issue_delta(&mut a, diff(&img[0], &img[1], 2)?).await?;
    let second = r.issue_delta(&mut a, diff(&img[0], &img[2], 3)?).await?;
    let landed = r.land(&second).await;
    assert_eq!(r.settle(&mut a, second, landed)?, None);

    let b_replica = Replica::open(store.clone(), &p, Settings::default()).await?;
    let mut b = b_replica.claim(&acme, "b", true).await?;
    assert_eq!(
        b.seq(),
        s.seq + 1,
        "the claim takes the slot the writer's ship needs"
    );
    let tmp = tempfile::tempdir()?;
    let h = b_replica.hydrate(&mut b, &tmp.path().join("db")).await?;
    assert_eq!((h.position, h.commit), (Some(s.seq), 1));
    assert!(std::fs::read(tmp.path().join("db"))? == img[0]);

    let late = r.land(&first).await;
    assert!(
        matches!(late, Landing::Failed(Error::Fenced { .. })),
        "{late:?}"
    );
    assert!(matches!(
        r.settle(&mut a, first, late),
        Err(Error::Fenced { .. })
    ));
    assert!(a.unusable().is_some());

    // The successor's first delta finds the writer's stray in its next slot and goes above.
    let mine = b_replica
        .ship_delta(&mut b, diff(&img[0], &img[3], 2)?)
        .await?;
    assert_eq!(mine.seq, s.seq + 3);
    let newest = tmp.path().join("newest");
    let h = r.restore(&acme, None, &newest).await?;
    assert_eq!(h.position, Some(s.seq + 3));
    assert!(std::fs::read(&newest)? == img[3]);
    let report = r.verify(&acme).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    // The stray stays through retention once a newer snapshot is above it: deleting it
    // would leave a hole in the kept older chain (R3), which verify and restore would call
    // damage.
    let full = b_replica
        .ship(&mut b, Snapshot::from_bytes(img[3].clone(), 3))
        .await?;
    b_replica
        .retain(
            &acme,
            &Retention {
                keep_snapshots: 2,
                keep_ms: 0,
                window_ms: 0,
                level_ms: 0,
            },
        )
        .await?;
    let report = r.verify(&acme).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let dest = tmp.path().join("at-mine");
    r.restore(&acme, Some(mine.seq), &dest).await?;
    assert!(std::fs::read(&dest)? == img[3]);
    // A third claimer takes the slot above the successor's last entry.
    b_replica.release(&mut b).await?;
    let c = r.claim(&acme, "c", false).await?;
    assert_eq!(c.seq(), full.seq + 2);
    Ok(())
}

/// Retention takes an object as an orphan only where the log settled its slot (R4): the
/// blob of an empty slot above the newest snapshot may be a ship in flight and stays, even
/// below the head; one whose slot holds another entry goes.
pub(super) async fn retention_keeps_a_blob_that_may_be_in_flight_below_the_head(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let r = pipelined(store.clone(), &p).await?;
    let acme = org("acme");
    let img = images()?;
    let mut a = r.claim(&acme, "a", false).await?;
    let s = r
        .ship(&mut a, Snapshot::from_bytes(img[0].clone(), 1))
        .await?;
    // Slot s+1 in flight (its blob uploaded, its entry not yet), s+2 landed.
    let first = r.issue_delta(&mut a, diff(&img[0], &img[1], 2)?).await?;
    let second = r.issue_delta(&mut a, diff(&img[0], &img[2], 3)?).await?;
    let landed = r.land(&second).await;
    r.settle(&mut a, second, landed)?;
    let blob = |seq: u64| -> Result<Path, Error> {
        Ok(Path::from(format!(
            "{p}/orgs/acme/snap/{}",
            delta_blob_name(seq, a.round(), &new_nonce()?)
        )))
    };
    let in_flight = blob(first.seq())?;
    let settled = blob(s.seq)?;
    for path in [&in_flight, &settled] {
        store.put(path, PutPayload::from_static(b"x")).await?;
    }
    let report = r
        .retain(
            &acme,
            &Retention {
                keep_snapshots: 1,
                keep_ms: 0,
                window_ms: 0,
                level_ms: 0,
            },
        )
        .await?;
    assert!(
        report.deleted_blobs.contains(&settled.to_string()),
        "{report:?}"
    );
    assert!(store.head(&in_flight).await.is_ok(), "{report:?}");
    let landed = r.land(&first).await;
    assert!(r.settle(&mut a, first, landed)?.is_some());
    Ok(())
}

/// Guards against a broken lookup (found by an adversarial review of `docs/design.md` 2d): a closed chain continued across a
/// pipelined writer that left a stray (R1) is compacted (its deltas are not pipelined: the
/// stray is not one of them) and thinned; retention keeps the stray (it was on a kept
/// chain's stray list when the run began). The thinned chain now has a gap below the
/// stray, so `position_at_time` for any moment between the stray's time and the next kept
/// position walks `chain::newest` from the snapshot, meets the gap and fails the whole
/// lookup with `ChainBroken` (before thinning it skipped the stray), and `verify` reports
/// the stray as a delta on no chain. Expected: the lookup answers a kept position and
/// verify finds nothing wrong.
pub(super) async fn a_stray_in_a_thinned_chain_goes_with_it_and_breaks_no_lookup(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let z = Replica::open(store.clone(), &p, Settings::default()).await?;
    let ar = pipelined(store.clone(), &p).await?;
    let br = Replica::open(store.clone(), &p, Settings::default()).await?;
    let acme = org("acme");
    let tmp = tempfile::tempdir()?;
    let mut db = Db::new()?;
    db.exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 20) INSERT INTO t SELECT i, randomblob(300) FROM n")?;
    let mut img = vec![db.image()?];
    for i in 0..12 {
        db.exec(&format!(
            "INSERT OR REPLACE INTO t VALUES ({}, randomblob(500))",
            i % 7
        ))?;
        img.push(db.image()?);
    }
    let pause = || tokio::time::sleep(std::time::Duration::from_millis(5));
    // z: a snapshot and four deltas, then a clean release.
    let mut zc = z.claim(&acme, "z", false).await?;
    z.ship(&mut zc, Snapshot::from_bytes(img[0].clone(), 1))
        .await?;
    for i in 1..=4 {
        pause().await;
        z.ship_delta(&mut zc, diff(&img[i - 1], &img[i], i as u64 + 1)?)
            .await?;
    }
    z.release(&mut zc).await?;
    // a (pipelined) continues the chain: two ships in flight, only the second lands.
    let mut a = ar.claim(&acme, "a", false).await?;
    ar.hydrate(&mut a, &tmp.path().join("a")).await?;
    pause().await;
    let first = ar.issue_delta(&mut a, diff(&img[4], &img[5], 6)?).await?;
    let second = ar.issue_delta(&mut a, diff(&img[4], &img[6], 7)?).await?;
    let stray_seq = second.seq();
    let landed = ar.land(&second).await;
    let _ = ar.settle(&mut a, second, landed);
    // b takes over at the first ship's slot: the landed one is a stray.
    pause().await;
    let mut b = br.claim(&acme, "b", true).await?;
    assert_eq!(b.seq(), first.seq());
    br.hydrate(&mut b, &tmp.path().join("b")).await?;
    let mut prev = 4;
    for i in 7..=10 {
        pause().await;
        br.ship_delta(&mut b, diff(&img[prev], &img[i], i as u64)?)
            .await?;
        prev = i;
    }
    pause().await;
    br.ship(&mut b, Snapshot::from_bytes(img[10].clone(), 11))
        .await?;
    let log = br.history(&acme).await?;
    let stray_at = log
        .iter()
        .find(|e| e.seq() == stray_seq)
        .map(crate::LogEntry::at_ms)
        .ok_or("the stray did not land")?;
    // Before thinning the moment of the stray answers the snapshot's chain.
    let before = br.position_at_time(&acme, stray_at).await?;
    let policy = Retention {
        keep_snapshots: 1,
        keep_ms: 0,
        window_ms: crate::DEFAULT_WINDOW_MS,
        level_ms: 60_000,
    };
    let compacted = br.compact_levels(&acme, &policy).await?;
    assert_eq!(compacted.written.len(), 1, "{compacted:?}");
    let report = br.retain(&acme, &policy).await?;
    assert!(!report.deleted_entries.is_empty(), "{report:?}");
    assert!(
        !br.history(&acme)
            .await?
            .iter()
            .any(|e| e.seq() == stray_seq),
        "the stray outlived the chain it strayed into"
    );
    let after = br.position_at_time(&acme, stray_at).await;
    assert!(
        after.is_ok(),
        "position_at_time for the stray's moment answered {after:?} (before thinning: {before})"
    );
    let verified = br.verify(&acme).await?;
    assert!(verified.failed.is_empty(), "{:?}", verified.failed);
    Ok(())
}
