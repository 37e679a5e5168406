//! The point-in-time window's levels (`docs/design.md` 2d): closed chains compacted into
//! level files restore every kept moment byte for byte, before and after retention thins
//! their deltas; a thinned position is refused, never answered with a neighbour.

use std::collections::BTreeMap;
use std::sync::Arc;

use idem_base::{Clock, ManualClock, SeededRng, SystemClock};
use object_store::ObjectStore;

use object_store::ObjectStoreExt;

use super::db::{Db, diff, page};
use super::{CaseResult, org, prefix};
use crate::testing::fault::{Fault, FaultStore, Op};
use crate::{Error, Replica, Retention, Settings, Snapshot};

/// One published position: its seq, its writer's time, and the database there.
pub(super) struct Position {
    pub(super) seq: u64,
    pub(super) at_ms: u64,
    pub(super) image: Vec<u8>,
    pub(super) snapshot: bool,
}

pub(super) const MINUTE: u64 = 60_000;

/// A recorded history of `chains` chains of random writes, published on a manual clock
/// that starts three hours ago (so the store's clock agrees with "now" at the end), each
/// chain closed by a full snapshot. Returns the replica, its clock and the positions.
async fn history(
    store: Arc<dyn ObjectStore>,
    seed: u64,
    chains: usize,
) -> Result<(Replica, Arc<ManualClock>, Vec<Position>), Box<dyn std::error::Error + Send + Sync>> {
    history_with(store, seed, chains, Settings::default(), None).await
}

/// [`history`] on a replica with `settings` and `failpoints`.
pub(super) async fn history_with(
    store: Arc<dyn ObjectStore>,
    seed: u64,
    chains: usize,
    settings: Settings,
    failpoints: Option<Arc<dyn crate::Failpoints>>,
) -> Result<(Replica, Arc<ManualClock>, Vec<Position>), Box<dyn std::error::Error + Send + Sync>> {
    let now = SystemClock.now_ms();
    let clock = Arc::new(ManualClock::new(now - 3 * 60 * MINUTE));
    let r = Replica::open_with(store, &prefix()?, settings, clock.clone(), failpoints).await?;
    let acme = org("acme");
    let mut claim = r.claim(&acme, "a", false).await?;
    let mut rng = SeededRng::new(seed);
    let mut db = Db::new()?;
    db.exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 30) INSERT INTO t SELECT i, randomblob(200) FROM n")?;
    let mut prev = db.image()?;
    let mut commit = 1;
    let s = r
        .ship(&mut claim, Snapshot::from_bytes(prev.clone(), commit))
        .await?;
    let mut out = vec![Position {
        seq: s.seq,
        at_ms: clock.now_ms(),
        image: prev.clone(),
        snapshot: true,
    }];
    for _ in 0..chains {
        for step in 0..6 + rng.below(10) {
            // Seconds to minutes apart: some buckets get several positions, some one.
            clock.advance(2_000 + rng.below(100_000));
            let id = rng.below(60);
            let q = match rng.below(4) {
                0 => format!(
                    "INSERT OR REPLACE INTO t VALUES ({id}, randomblob({}))",
                    50 + rng.below(3000)
                ),
                1 => format!(
                    "UPDATE t SET v = randomblob(20) WHERE id % {} = 0",
                    2 + rng.below(5)
                ),
                2 => format!("DELETE FROM t WHERE id = {id}"),
                _ => "DELETE FROM t WHERE id > 40; VACUUM".to_owned(),
            };
            db.exec(&q)?;
            let next = db.image()?;
            commit += 1;
            let mut delta = diff(&prev, &next, commit)?;
            if step % 2 == 1 {
                delta = delta.encode_against(|p| page(&prev, p));
            }
            let shipped = r.ship_delta(&mut claim, delta).await?;
            out.push(Position {
                seq: shipped.seq,
                at_ms: clock.now_ms(),
                image: next.clone(),
                snapshot: false,
            });
            prev = next;
        }
        clock.advance(1_000 + rng.below(MINUTE));
        commit += 1;
        let s = r
            .ship(&mut claim, Snapshot::from_bytes(prev.clone(), commit))
            .await?;
        out.push(Position {
            seq: s.seq,
            at_ms: clock.now_ms(),
            image: prev.clone(),
            snapshot: true,
        });
    }
    Ok((r, clock, out))
}

/// The positions a window keeps once closed chains are thinned: every snapshot, and the
/// last delta of each minute of each chain (a chain of fewer than four deltas keeps all).
pub(super) fn kept_after_thinning(positions: &[Position]) -> BTreeMap<u64, bool> {
    let mut kept = BTreeMap::new();
    let mut chain: Vec<&Position> = Vec::new();
    let flush = |chain: &mut Vec<&Position>, kept: &mut BTreeMap<u64, bool>| {
        let all = chain.len() < crate::LEVEL_MIN_DELTAS;
        for (i, p) in chain.iter().enumerate() {
            let last = chain
                .get(i + 1)
                .is_none_or(|n| n.at_ms / MINUTE != p.at_ms / MINUTE);
            kept.insert(p.seq, all || last);
        }
        chain.clear();
    };
    for p in positions {
        if p.snapshot {
            flush(&mut chain, &mut kept);
            kept.insert(p.seq, true);
        } else {
            chain.push(p);
        }
    }
    kept
}

/// Every position of three closed chains restores byte for byte from the log and from
/// level files alike; once retention thinned the closed chains, every kept position (a
/// snapshot, a bucket's last delta) still restores byte for byte, every other one is
/// `PositionNotKept`, and a random moment restores to the newest kept position at or
/// before it, reading a snapshot, one level file and at most a bucket of deltas.
pub(super) async fn levels_restore_every_kept_moment_byte_for_byte(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let (r, clock, positions) = history(store, 7, 3).await?;
    let acme = org("acme");
    // The defaults: every position for an hour, a minute's last for 30 days.
    let policy = Retention {
        keep_snapshots: 1,
        ..Retention::default()
    };
    assert_eq!(
        (policy.keep_ms, policy.level_ms, policy.window_ms),
        (60 * MINUTE, MINUTE, 30 * 24 * 60 * MINUTE)
    );
    let report = r.compact_levels(&acme, &policy).await?;
    assert_eq!(
        report.written.len(),
        3,
        "one level file per closed chain: {report:?}"
    );
    let again = r.compact_levels(&acme, &policy).await?;
    assert!(again.written.is_empty() && again.present == 3, "{again:?}");
    let tmp = tempfile::tempdir()?;
    let restore = |seq: u64| {
        let r = r.clone();
        let acme = acme.clone();
        let dest = tmp.path().join(format!("at-{seq}"));
        async move {
            let h = r.restore(&acme, Some(seq), &dest).await?;
            let got = std::fs::read(&dest).map_err(|e| Error::io(&dest, e))?;
            Ok::<_, Error>((h, got))
        }
    };
    for p in &positions {
        let (h, got) = restore(p.seq).await?;
        assert_eq!(h.position, Some(p.seq));
        assert!(
            got == p.image,
            "restore at {} differs before thinning",
            p.seq
        );
    }
    // Two hours on: every delta of a closed chain is older than keep_ms.
    clock.set(SystemClock.now_ms());
    let report = r.retain(&acme, &policy).await?;
    assert!(!report.age_skipped);
    let kept = kept_after_thinning(&positions);
    let thinned: Vec<u64> = kept.iter().filter(|(_, k)| !**k).map(|(s, _)| *s).collect();
    assert!(!thinned.is_empty(), "the history thinned nothing");
    // Every delta of a closed chain went: its kept positions live on in the level files.
    let deltas: Vec<u64> = positions
        .iter()
        .filter(|p| !p.snapshot)
        .map(|p| p.seq)
        .collect();
    assert_eq!(report.deleted_entries, deltas);
    for p in &positions {
        let dest = tmp.path().join(format!("after-{}", p.seq));
        let got = r.restore(&acme, Some(p.seq), &dest).await;
        if kept.get(&p.seq).copied().unwrap_or(false) {
            let h = got?;
            assert_eq!(h.position, Some(p.seq));
            assert!(
                std::fs::read(&dest)? == p.image,
                "restore at {} differs after thinning",
                p.seq
            );
        } else {
            assert!(
                matches!(got, Err(Error::PositionNotKept { seq, .. }) if seq == p.seq),
                "thinned position {} answered {got:?}",
                p.seq
            );
            assert!(!dest.exists(), "a refused restore left a file");
        }
    }
    // Verify checks every level file on its snapshot: every kept position passes.
    let verified = r.verify(&acme).await?;
    assert!(verified.failed.is_empty(), "{:?}", verified.failed);
    let want: Vec<u64> = kept.iter().filter(|(_, k)| **k).map(|(s, _)| *s).collect();
    assert_eq!(verified.ok, want);
    let mut rng = SeededRng::new(11);
    let (first, last) = (positions[0].at_ms, positions.last().map_or(0, |p| p.at_ms));
    for _ in 0..40 {
        let at = first + rng.below(last - first + 1);
        let want = positions
            .iter()
            .rev()
            .find(|p| p.at_ms <= at && kept.get(&p.seq).copied().unwrap_or(false))
            .map(|p| p.seq);
        let got = r.position_at_time(&acme, at).await?;
        assert_eq!(Some(got), want, "moment {at}");
        let before = r.store_requests();
        let (_, image) = restore(got).await?;
        let reads = r.store_requests().since(&before);
        let p = positions.iter().find(|p| p.seq == got).map(|p| &p.image);
        assert!(Some(&image) == p, "restore for moment {at} differs");
        // The log's entries (a claim, four snapshots), a manifest, its segment, one level
        // file and at most a bucket of deltas.
        assert!(reads.get <= 16, "a restore read {} objects", reads.get);
    }
    Ok(())
}

/// The policy of the fault cases: one minute buckets, deltas kept an hour, every snapshot
/// kept for the window.
fn window() -> Retention {
    Retention {
        keep_snapshots: 1,
        keep_ms: 60 * MINUTE,
        window_ms: crate::DEFAULT_WINDOW_MS,
        level_ms: MINUTE,
    }
}

/// Every recorded position `keep` accepts restores byte for byte.
async fn restores(r: &Replica, positions: &[Position], keep: impl Fn(u64) -> bool) -> CaseResult {
    let acme = org("acme");
    let tmp = tempfile::tempdir()?;
    for p in positions.iter().filter(|p| keep(p.seq)) {
        let dest = tmp.path().join(format!("at-{}", p.seq));
        r.restore(&acme, Some(p.seq), &dest).await?;
        assert!(
            std::fs::read(&dest)? == p.image,
            "restore at {} differs",
            p.seq
        );
    }
    Ok(())
}

/// A compaction whose level-file PUT fails writes nothing, and retention then deletes no
/// delta (nothing covers them); one whose PUT lands but reports an error (an unknown
/// outcome) is found by the next run, which writes nothing again, and thinning goes ahead.
pub(super) async fn a_level_file_put_that_fails_or_lands_unseen_loses_no_position(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let faults = Arc::new(FaultStore::new(store));
    let (r, clock, positions) = history(faults.clone(), 21, 2).await?;
    let acme = org("acme");
    faults.inject(Op::Put, "/levels/", 1, Fault::FailBefore);
    assert!(matches!(
        r.compact_levels(&acme, &window()).await,
        Err(Error::Store { .. })
    ));
    assert!(r.level_names(&acme).await?.is_empty());
    clock.set(SystemClock.now_ms());
    let report = r.retain(&acme, &window()).await?;
    assert!(
        report.deleted_entries.is_empty(),
        "thinned without a level file: {report:?}"
    );
    restores(&r, &positions, |_| true).await?;

    faults.inject(Op::Put, "/levels/", 1, Fault::FailAfter);
    assert!(r.compact_levels(&acme, &window()).await.is_err());
    // The first chain's file landed: found, not written again; the run goes on to the next.
    let first = r.level_names(&acme).await?;
    assert_eq!(first.len(), 1, "{first:?}");
    let again = r.compact_levels(&acme, &window()).await?;
    assert_eq!(again.present, 1, "the landed file was not found: {again:?}");
    assert!(
        again.written.iter().all(|n| *n != first[0].name),
        "{again:?}"
    );
    let report = r.retain(&acme, &window()).await?;
    assert!(!report.deleted_entries.is_empty());
    let kept = kept_after_thinning(&positions);
    restores(&r, &positions, |seq| {
        kept.get(&seq).copied().unwrap_or(false)
    })
    .await?;
    Ok(())
}

/// A compaction paused before its PUT while retention deletes the chain it read (the window
/// closed): the level file it then creates names a snapshot no longer kept, and the next
/// retention run deletes it; no reader ever plans through it.
pub(super) async fn a_compaction_racing_retention_leaves_no_level_file_behind(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let faults = Arc::new(FaultStore::new(store));
    let (r, clock, positions) = history(faults.clone(), 33, 2).await?;
    let acme = org("acme");
    clock.set(SystemClock.now_ms());
    let close = Retention {
        keep_snapshots: 1,
        keep_ms: 0,
        window_ms: 0,
        level_ms: MINUTE,
    };
    let paused = faults.pause_next(Op::Put, "/levels/");
    let compaction = r.compact_levels(&acme, &close);
    let retention = async {
        paused.reached.await.ok();
        let report = r.retain(&acme, &close).await;
        let _ = paused.resume.send(());
        report
    };
    let (compacted, retained) = tokio::join!(compaction, retention);
    let retained = retained?;
    assert!(
        !retained.deleted_entries.is_empty(),
        "retention deleted nothing"
    );
    // The compactor read the first chain before retention removed it; it may have created
    // its file or given up on a chain whose objects vanished.
    compacted?;
    let newest = positions.last().map_or(0, |p| p.seq);
    let after = r.retain(&acme, &close).await?;
    let left = r.level_names(&acme).await?;
    assert!(
        left.iter().all(|l| l.snapshot >= newest),
        "orphan level files stay: {left:?} ({after:?})"
    );
    let tmp = tempfile::tempdir()?;
    let dest = tmp.path().join("newest");
    let h = r.restore(&acme, None, &dest).await?;
    assert_eq!(h.position, Some(newest));
    Ok(())
}

/// A level file damaged in the store (a section's frame, or its header): retention does not
/// thin the chain it would cover, and every position, still in the log, restores byte for
/// byte through the log instead; never a wrong image.
pub(super) async fn a_damaged_level_file_thins_nothing_and_restores_from_the_log(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let (r, clock, positions, path, good) = compacted_one_chain(&store).await?;
    let acme = org("acme");
    clock.set(SystemClock.now_ms());
    for at in [good.len() - 1, 60] {
        let mut bad = good.clone();
        bad[at] ^= 0x55;
        store.put(&path, bad.into()).await?;
        let report = r.retain(&acme, &window()).await?;
        assert!(
            report.deleted_entries.is_empty(),
            "thinned under a level file damaged at byte {at}: {report:?}"
        );
        restores(&r, &positions, |_| true).await?;
    }
    Ok(())
}

/// A compaction reads the segments its chain's deltas touch, not the snapshot: on a
/// snapshot of many small segments, a chain of one-row updates compacts with a few segment
/// GETs, and every kept position still restores byte for byte (the level file's sections
/// rebuilt on the whole snapshot, checksums and all).
pub(super) async fn a_compaction_reads_only_the_segments_its_deltas_touch(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let now = SystemClock.now_ms();
    let clock = Arc::new(ManualClock::new(now - 3 * 60 * MINUTE));
    let settings = Settings {
        segment_bytes: 4 * 1024,
        ..Settings::default()
    };
    let r = Replica::open_with(store, &prefix()?, settings, clock.clone(), None).await?;
    let acme = org("acme");
    let mut claim = r.claim(&acme, "a", false).await?;
    let mut db = Db::new()?;
    db.exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 400) INSERT INTO t SELECT i, randomblob(400) FROM n")?;
    let mut prev = db.image()?;
    let segments = prev.len() / (4 * 1024);
    r.ship(&mut claim, Snapshot::from_bytes(prev.clone(), 1))
        .await?;
    let mut positions = Vec::new();
    for (i, id) in [7u64, 300, 7, 150, 399, 12].into_iter().enumerate() {
        clock.advance(45_000);
        db.exec(&format!("UPDATE t SET v = randomblob(400) WHERE id = {id}"))?;
        let next = db.image()?;
        let mut delta = diff(&prev, &next, i as u64 + 2)?;
        if i % 2 == 0 {
            delta = delta.encode_against(|p| page(&prev, p));
        }
        let shipped = r.ship_delta(&mut claim, delta).await?;
        positions.push(Position {
            seq: shipped.seq,
            at_ms: clock.now_ms(),
            image: next.clone(),
            snapshot: false,
        });
        prev = next;
    }
    clock.advance(MINUTE);
    r.ship(&mut claim, Snapshot::from_bytes(prev.clone(), 9))
        .await?;
    let before = r.store_requests();
    let report = r.compact_levels(&acme, &window()).await?;
    let reads = r.store_requests().since(&before);
    assert_eq!(report.written.len(), 1, "{report:?}");
    // The log's entries (a claim, two snapshots, six deltas), the manifest, and the
    // segments of the pages six one-row updates touch (their leaves, page 1, the root).
    assert!(
        (reads.get as usize) < 10 + segments / 4,
        "a compaction read {} objects from a snapshot of {segments} segments",
        reads.get
    );
    restores(&r, &positions, |_| true).await?;
    clock.set(SystemClock.now_ms());
    r.retain(&acme, &window()).await?;
    let kept = kept_after_thinning(&positions);
    restores(&r, &positions, |seq| {
        kept.get(&seq).copied().unwrap_or(false)
    })
    .await?;
    Ok(())
}

/// Guards against an abort (found by an adversarial review): a crafted level file whose
/// header (its sha256 recomputed, as anyone able to write the object can do) claims a section
/// of 64 TiB made decompression reserve it, and retention (inline in the org's shipper loop),
/// restore and verify aborted the process. It must be `Corrupt`: retention thins nothing and
/// every position restores from the log.
pub(super) async fn a_crafted_level_section_size_is_corrupt_not_an_abort(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    use sha2::{Digest, Sha256};
    let (r, clock, positions, path, good) = compacted_one_chain(&store).await?;
    let acme = org("acme");
    let len = u32::from_le_bytes([good[12], good[13], good[14], good[15]]) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&good[48..48 + len])?;
    header["sections"][0]["bytes"] = serde_json::json!(1u64 << 46);
    let json = serde_json::to_vec(&header)?;
    let mut bad = Vec::new();
    bad.extend_from_slice(&good[..12]);
    bad.extend_from_slice(&(json.len() as u32).to_le_bytes());
    bad.extend_from_slice(&Sha256::digest(&json));
    bad.extend_from_slice(&json);
    bad.extend_from_slice(&good[48 + len..]);
    store.put(&path, bad.into()).await?;
    clock.set(SystemClock.now_ms());
    let report = r.retain(&acme, &window()).await?;
    assert!(
        report.deleted_entries.is_empty(),
        "thinned under a crafted level file: {report:?}"
    );
    restores(&r, &positions, |_| true).await?;
    Ok(())
}

/// A one-chain history compacted: the replica, its clock, the positions, and the path and
/// bytes of the chain's level file (for the cases that damage it).
async fn compacted_one_chain(
    store: &Arc<dyn ObjectStore>,
) -> Result<
    (
        Replica,
        Arc<ManualClock>,
        Vec<Position>,
        object_store::path::Path,
        Vec<u8>,
    ),
    Box<dyn std::error::Error + Send + Sync>,
> {
    let (r, clock, positions) = history(store.clone(), 45, 1).await?;
    let acme = org("acme");
    r.compact_levels(&acme, &window()).await?;
    let levels = r.level_names(&acme).await?;
    let [level] = levels.as_slice() else {
        return Err(format!("one level file expected: {levels:?}").into());
    };
    let path = r.inner.store.layout.level(&acme, &level.name);
    let good = store.get(&path).await?.bytes().await?.to_vec();
    Ok((r, clock, positions, path, good))
}
