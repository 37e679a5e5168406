//! An attack on T4 as built (`docs/design.md` 3g, "T4 as built: a journal org's log
//! retention", `replica/src/journal/log_retain.rs`): what a retention run of a journal org's
//! log may delete, against per-org zombies below the journal's tenure, readers whose log
//! listing predates a newer checkpoint, sections naming an older base, a holder checkpointing
//! while another process retains, and damaged logs. Steps are interposed at exact store
//! requests, never ordered by sleeping.

#![allow(clippy::unwrap_used, clippy::too_many_lines, missing_docs)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use common::interpose::{Hook, Interpose};
use common::journal::{
    checkpoint, claim_after, cp_header, delta_cp, image, image_section, landed, log_path, run_of,
    settled_batch, snap_cp, writer,
};
use common::{R, memory, objects, open, org};
use futures::TryStreamExt;
use idem_replica::journal::*;
use idem_replica::{Claim, Error, OrgId, Replica, Retention, Snapshot};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// Everything is older than `keep_ms`, and only the newest snapshot is kept by count: the
/// rule's structural roots alone decide.
fn old() -> Retention {
    Retention {
        keep_ms: 0,
        keep_snapshots: 1,
        ..Retention::default()
    }
}

/// The bytes `restore` installs for `o` (its walk's state for `None`, the entry at `seq`
/// rebuilt by its base links otherwise), or its error.
async fn restored(r: &Replica, o: &OrgId, at: Option<u64>) -> Result<Vec<u8>, Error> {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("org.db");
    r.restore(o, at, &dest).await?;
    Ok(std::fs::read(&dest).unwrap())
}

/// The seqs of `o`'s log as the store lists them.
async fn log_seqs(store: &Arc<dyn ObjectStore>, o: &OrgId) -> BTreeSet<u64> {
    store
        .list(Some(&Path::from(format!("orgs/{o}/log"))))
        .map_ok(|m| {
            m.location
                .filename()
                .unwrap()
                .trim_end_matches(".json")
                .parse::<u64>()
                .unwrap()
        })
        .try_collect()
        .await
        .unwrap()
}

/// Images 1 to `n`: image `i` has `2 * i` rows at commit `i`.
fn images(n: u64) -> Vec<Vec<u8>> {
    (1..=n).map(|i| image(2 * i, i)).collect()
}

/// A journal claim of `o` at 1 (round `round`) after `empty`, continuing in run 1: the run
/// and the claim's tenure.
async fn claimed(r: &Replica, o: &OrgId, round: u64) -> (RunName, Via) {
    let run = run_of(1);
    let c = claim_after(r, o, (1, round), &run, Some(FreePoint::Empty)).await;
    (run, Via::Claim { seq: c })
}

/// `acme` on a fresh store, held by writer "j" in run 1 (a claim at 1 after `empty`, round
/// 1): an empty batch at slot 1, a snapshot checkpoint of `imgs[0]` at 2 through it, and a
/// section to `imgs[1]` on that checkpoint at slot 2.
struct Held {
    store: Arc<dyn ObjectStore>,
    o: OrgId,
    /// The holder's handle.
    r: Replica,
    /// [`images`] `(n)`.
    imgs: Vec<Vec<u8>>,
    run: RunName,
    via: Via,
    writer: Run,
    /// The section's slot.
    s2: u64,
}

/// [`Held`] with `n` images.
async fn held(n: u64) -> R<Held> {
    let store = memory();
    let o = org("acme");
    let r = open(store.clone()).await;
    let imgs = images(n);
    let (run, via) = claimed(&r, &o, 1).await;
    let mut w = writer(&run, "j", 1, &[&o]);
    let s1 = settled_batch(&r, &mut w, vec![]).await;
    snap_cp(&r, &o, (2, 1), &run, &via, s1, &imgs[0], 1).await;
    let section = image_section(&o, &via, (2, &imgs[0]), &imgs[1], 2);
    let s2 = settled_batch(&r, &mut w, vec![section]).await;
    Ok(Held {
        store,
        o,
        r,
        imgs,
        run,
        via,
        writer: w,
        s2,
    })
}

/// The journal's side of the per-org zombie tests, once Q's Release entry is at `released`:
/// a journal claim after it (round `round`) and a snapshot checkpoint of `taken` (commit
/// `commit`) just above, where the walk starts; a retention run of the org; then the paused
/// per-org zombie P ships commit 9 and must be `Fenced`. The journal's handle.
async fn journal_above_then_zombie_ships(
    store: &Arc<dyn ObjectStore>,
    o: &OrgId,
    (p, zombie): (&Replica, &mut Claim),
    (released, round): (u64, u64),
    taken: &[u8],
    commit: u64,
) -> R<Replica> {
    let j = open(store.clone()).await;
    let run = run_of(1);
    let after = Some(FreePoint::Entry { seq: released });
    let c = claim_after(&j, o, (released + 1, round), &run, after).await;
    let via = Via::Claim { seq: c };
    snap_cp(&j, o, (released + 2, round), &run, &via, 1, taken, commit).await;
    let before = j.walk_org(o).await?;
    assert!(
        matches!(before.state, WalkState::Entry { seq } if seq == released + 2),
        "{:?}",
        before.state
    );

    let report = j.retain(o, &old()).await?;
    eprintln!("retention deleted {:?}", report.deleted_entries);

    let shipped = p.ship(zombie, Snapshot::from_bytes(image(9, 9), 9)).await;
    assert!(
        matches!(shipped, Err(Error::Fenced { .. })),
        "the per-org zombie acknowledged commit 9 at seq {:?} after retention freed {:?}",
        shipped.as_ref().map(|s| s.seq),
        report.deleted_entries
    );
    Ok(j)
}

/// I7 against a per-org zombie below the journal's tenure. A per-org holder P (claim 1,
/// snapshot 2) is taken over by a forced per-org claim Q (claim 3) while P is paused; Q
/// ships (4) and releases (5); a journal claim names that Release entry (6) and checkpoints
/// (7). Retention of the journal org runs. P resumes and ships at the slot after its own
/// last entry, 3: per-org fencing (2a) is that create colliding with Q's claim, which per-org
/// retention never deletes ("claims and releases always stay"). P must be `Fenced` and
/// acknowledge nothing; the walk must still read the journal's state.
#[tokio::test]
async fn a_per_org_zombie_below_the_journal_tenure_is_still_fenced_by_its_create() -> R {
    let store = memory();
    let o = org("acme");
    let p = open(store.clone()).await;
    let mut zombie = p.claim(&o, "p", false).await?;
    p.ship(&mut zombie, Snapshot::from_bytes(image(2, 2), 2))
        .await?;

    let q = open(store.clone()).await;
    let mut taker = q.claim(&o, "q", true).await?;
    let taken = image(3, 3);
    q.ship(&mut taker, Snapshot::from_bytes(taken.clone(), 3))
        .await?;
    q.release(&mut taker).await?;
    assert_eq!(log_seqs(&store, &o).await, (1..=5).collect());

    let j =
        journal_above_then_zombie_ships(&store, &o, (&p, &mut zombie), (5, 3), &taken, 3).await?;
    let after = j.walk_org(&o).await?;
    assert!(
        matches!(after.state, WalkState::Entry { seq: 7 }),
        "{:?}",
        after.state
    );
    Ok(())
}

/// A reader whose log LIST was taken before the holder's newer checkpoint landed, and whose
/// GETs run after a retention run (another process) that saw that checkpoint and deleted the
/// older ones: the reader must not silently walk from an older checkpoint (or from no
/// checkpoint at all) and install an older state than the newest acknowledged one (I10:
/// hydrate never falls back). Before T4 a journal org's entries never vanished; now they do,
/// and `Log::read_all` drops a listed entry that is gone when read.
#[tokio::test]
async fn a_walk_listed_before_a_checkpoint_and_read_after_retention_does_not_fall_back() -> R {
    let raw = memory();
    let o = org("acme");
    let holder = open(raw.clone()).await;
    let (run, via) = claimed(&holder, &o, 1).await;
    let (a, b, newest) = (image(2, 1), image(4, 2), image(6, 3));
    snap_cp(&holder, &o, (2, 1), &run, &via, 1, &a, 1).await;
    delta_cp(&holder, &o, (3, 1), &run, &via, 2, (2, &a), &b, 2).await;

    let interposed = Interpose::new(raw.clone());
    let hook: Hook = Box::pin({
        let (holder, o, run, via, newest, raw) = (
            holder.clone(),
            o.clone(),
            run.clone(),
            via.clone(),
            newest.clone(),
            raw.clone(),
        );
        async move {
            // The holder's next checkpoint (a snapshot: the chain bound) lands, then a
            // retention run of another process sees it and deletes what it may.
            snap_cp(&holder, &o, (4, 1), &run, &via, 3, &newest, 3).await;
            let other = open(raw).await;
            // Two snapshots kept by count (the default keeps three): 4 and 2 stay, the delta
            // 3 (on no kept chain) goes.
            let policy = Retention {
                keep_snapshots: 2,
                ..old()
            };
            let report = other.retain(&o, &policy).await.unwrap();
            assert_eq!(report.deleted_entries, vec![3]);
            eprintln!(
                "retention under the reader deleted {:?}",
                report.deleted_entries
            );
        }
    });
    interposed.before_get(log_path(&o, 3), hook);
    let reader = open(interposed.clone()).await;
    let walk = reader.walk_org(&o).await?;
    assert!(interposed.fired(), "the interposed step never ran");
    // The read that lost 3 under it is read again: the walk starts at 4.
    assert!(
        matches!(walk.state, WalkState::Entry { seq: 4 }),
        "the reader's walk fell back: log {:?}, state {:?}",
        walk.log.keys().collect::<Vec<_>>(),
        walk.state
    );
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("org.db");
    let installed = reader.restore_walk(&o, &walk, &dest).await?;
    assert_eq!(installed, Some(3));
    assert!(std::fs::read(&dest)? == newest, "not the newest state");
    Ok(())
}

/// J3-6 and `restore --at`: a holder's newest checkpoint (a snapshot, 5) through slot 3 while
/// its section at slot 4, issued as that checkpoint was in flight, names the previous base
/// (4, a delta on 3). Retention keeps the section's base and its chain; it deletes only the
/// older snapshot 2 (nothing reads it). The walk's state and every kept position restore byte
/// for byte as before; the deleted one answers `NoSuchSnapshot`. Then the next checkpoint
/// lands (6, a delta on 5) with a section on it, and a second run deletes 3 and 4.
#[tokio::test]
async fn retention_keeps_an_older_base_a_section_names_and_every_kept_position_restores() -> R {
    let Held {
        store,
        o,
        r,
        imgs,
        run,
        via,
        mut writer,
        s2,
    } = held(6).await?;
    snap_cp(&r, &o, (3, 1), &run, &via, s2, &imgs[1], 2).await;
    let s3 = settled_batch(
        &r,
        &mut writer,
        vec![image_section(&o, &via, (3, &imgs[1]), &imgs[2], 3)],
    )
    .await;
    delta_cp(&r, &o, (4, 1), &run, &via, s3, (3, &imgs[1]), &imgs[2], 3).await;
    // The chain bound: a snapshot of the same state; the section in flight names 4.
    snap_cp(&r, &o, (5, 1), &run, &via, s3, &imgs[2], 3).await;
    settled_batch(
        &r,
        &mut writer,
        vec![image_section(&o, &via, (4, &imgs[2]), &imgs[3], 4)],
    )
    .await;

    let walk = r.walk_org(&o).await?;
    match &walk.state {
        WalkState::Section { section, .. } => assert_eq!(section.base.seq, 4),
        other => panic!("{other:?}"),
    }
    let mut before = BTreeMap::new();
    for seq in 2..=5 {
        before.insert(seq, restored(&r, &o, Some(seq)).await?);
    }
    assert!(restored(&r, &o, None).await? == imgs[3]);

    let fresh = open(store.clone()).await;
    let report = fresh.retain(&o, &old()).await?;
    assert_eq!(report.deleted_entries, vec![2], "{report:?}");
    assert_eq!(log_seqs(&store, &o).await, [1, 3, 4, 5].into());
    for reader in [&r, &fresh, &open(store.clone()).await] {
        assert!(
            restored(reader, &o, None).await? == imgs[3],
            "the walk's state moved"
        );
        for seq in [3, 4, 5] {
            assert!(
                restored(reader, &o, Some(seq)).await? == before[&seq],
                "position {seq}"
            );
        }
        let gone = restored(reader, &o, Some(2)).await;
        assert!(
            matches!(gone, Err(Error::NoSuchSnapshot { seq: 2, .. })),
            "{gone:?}"
        );
    }
    // A repeated run changes nothing.
    let again = fresh.retain(&o, &old()).await?;
    assert!(again.deleted_entries.is_empty(), "{again:?}");

    // The next checkpoint: a delta on 5 through slot 4; a section on it at slot 5.
    delta_cp(&r, &o, (6, 1), &run, &via, 4, (5, &imgs[2]), &imgs[3], 4).await;
    settled_batch(
        &r,
        &mut writer,
        vec![image_section(&o, &via, (6, &imgs[3]), &imgs[4], 5)],
    )
    .await;
    let report = fresh.retain(&o, &old()).await?;
    assert_eq!(report.deleted_entries, vec![3, 4], "{report:?}");
    assert!(restored(&fresh, &o, None).await? == imgs[4]);
    assert!(restored(&fresh, &o, Some(6)).await? == imgs[3]);
    assert!(restored(&fresh, &o, Some(5)).await? == imgs[2]);
    Ok(())
}

/// A retention run of another process interleaved with the holder: after the run listed and
/// read the log (its GET of the highest entry), the holder lands a snapshot checkpoint and a
/// section on it. The run judges only what it listed: the holder's new checkpoint, its
/// section's base, and every entry the walk reads stay, and the walk restores the holder's
/// newest state byte for byte, before and after another run.
#[tokio::test]
async fn a_holder_checkpointing_during_another_process_retention_keeps_its_bases() -> R {
    let Held {
        store: raw,
        o,
        r: holder,
        imgs,
        run,
        via,
        mut writer,
        s2,
    } = held(4).await?;
    delta_cp(
        &holder,
        &o,
        (3, 1),
        &run,
        &via,
        s2,
        (2, &imgs[0]),
        &imgs[1],
        2,
    )
    .await;
    let s3 = settled_batch(
        &holder,
        &mut writer,
        vec![image_section(&o, &via, (3, &imgs[1]), &imgs[2], 3)],
    )
    .await;

    let interposed = Interpose::new(raw.clone());
    let writer = Arc::new(tokio::sync::Mutex::new(writer));
    interposed.before_get(
        log_path(&o, 3),
        Box::pin({
            let (holder, o, run, via, imgs, writer) = (
                holder.clone(),
                o.clone(),
                run.clone(),
                via.clone(),
                imgs.clone(),
                writer.clone(),
            );
            async move {
                snap_cp(&holder, &o, (4, 1), &run, &via, s3, &imgs[2], 3).await;
                let mut w = writer.lock().await;
                settled_batch(
                    &holder,
                    &mut w,
                    vec![image_section(&o, &via, (4, &imgs[2]), &imgs[3], 4)],
                )
                .await;
            }
        }),
    );
    let other = open(interposed.clone()).await;
    let report = other.retain(&o, &old()).await?;
    assert!(interposed.fired(), "the interposed step never ran");
    let kept = log_seqs(&raw, &o).await;
    assert!(
        kept.contains(&4),
        "the holder's new checkpoint went: {report:?}"
    );
    let fresh = open(raw.clone()).await;
    assert!(restored(&fresh, &o, None).await? == imgs[3], "{report:?}");
    assert!(restored(&fresh, &o, Some(4)).await? == imgs[2]);
    // The next run sees 4 as the newest: 2 and 3 go, the walk's state does not move.
    let report = fresh.retain(&o, &old()).await?;
    eprintln!("second run deleted {:?}", report.deleted_entries);
    assert!(restored(&open(raw.clone()).await, &o, None).await? == imgs[3]);
    for seq in log_seqs(&raw, &o).await {
        if seq == 1 {
            continue;
        }
        restored(&fresh, &o, Some(seq))
            .await
            .unwrap_or_else(|e| panic!("kept position {seq} does not rebuild: {e}"));
    }
    Ok(())
}

/// Damage during retention: the newest checkpoint's chain has a missing link (the delta at 3
/// gone). The kept set cannot be computed, so the run must be a typed error and delete
/// nothing (the chain's snapshot 2 is still a restorable position).
#[tokio::test]
async fn a_missing_link_in_the_newest_chain_stops_retention_with_nothing_deleted() -> R {
    let store = memory();
    let o = org("acme");
    let r = open(store.clone()).await;
    let (run, via) = claimed(&r, &o, 2).await;
    let imgs = images(4);
    snap_cp(&r, &o, (2, 2), &run, &via, 1, &imgs[0], 1).await;
    delta_cp(&r, &o, (3, 2), &run, &via, 2, (2, &imgs[0]), &imgs[1], 2).await;
    delta_cp(&r, &o, (4, 2), &run, &via, 3, (3, &imgs[1]), &imgs[2], 3).await;
    // A fenced round-1 writer's snapshot checkpoint above: the newest snapshot by seq.
    snap_cp(&r, &o, (5, 1), &run, &via, 1, &imgs[3], 4).await;
    let position_2 = restored(&r, &o, Some(2)).await?;

    store.delete(&log_path(&o, 3)).await?;
    let before = objects(&store).await;
    let fresh = open(store.clone()).await;
    let ran = fresh.retain(&o, &old()).await;
    let after = objects(&store).await;
    assert!(
        ran.is_err() && after == before,
        "retention over a broken chain: {ran:?}; deleted {:?}",
        before
            .iter()
            .filter(|o| !after.contains(o))
            .map(|(p, _)| p.as_str())
            .collect::<Vec<_>>()
    );
    assert!(restored(&fresh, &o, Some(2)).await? == position_2);
    Ok(())
}

/// An entry of a journal org's log that does not decode: retention is a typed error and the
/// store is unchanged.
#[tokio::test]
async fn a_damaged_entry_stops_retention_with_nothing_deleted() -> R {
    let store = memory();
    let r = open(store.clone()).await;
    let imgs = images(2);
    let o2 = org("beta");
    let (run, via) = claimed(&r, &o2, 1).await;
    snap_cp(&r, &o2, (2, 1), &run, &via, 1, &imgs[0], 1).await;
    snap_cp(&r, &o2, (3, 1), &run, &via, 2, &imgs[1], 2).await;
    store
        .put(
            &log_path(&o2, 2),
            PutPayload::from(b"{\"seq\": 2, \"v\": 5".to_vec()),
        )
        .await?;
    let before = objects(&store).await;
    let ran = open(store.clone()).await.retain(&o2, &old()).await;
    assert!(ran.is_err(), "{ran:?}");
    assert_eq!(objects(&store).await, before, "a damaged log lost objects");
    Ok(())
}

/// T4's clause (c) for K1b: claimant A plans a claim after the free point 3 (the log then
/// `[1, 2, 3]`) and pauses. B claims after 3 (4), releases (5, 6); C claims after 6 (7) and
/// checkpoints (8). Retention frees B's claim 4 (among others). A resumes: its claim lands in the freed slot 4, and
/// its C2 listing meets the kept head above it, so it is abandoned (`Lost`); the walk still
/// starts at C's checkpoint and ends in C's tenure, and the next round is above every
/// serving tenure's.
#[tokio::test]
async fn a_paused_free_claimant_landing_in_a_freed_slot_is_abandoned_by_c2() -> R {
    let store = memory();
    let o = org("acme");
    let r = open(store.clone()).await;
    let imgs = images(3);
    let release_cp = |seq: u64, round: u64, run: RunName, via: Via, img: Vec<u8>, commit: u64| {
        let (r, o) = (r.clone(), o.clone());
        async move {
            let header = cp_header((seq, round), &run, &via, 1, true);
            checkpoint(&r, &o, header, &img, commit).await;
            landed(r.create_release(&o, (seq + 1, round), "j").await.unwrap());
        }
    };
    let c1 = claim_after(&r, &o, (1, 1), &run_of(1), Some(FreePoint::Empty)).await;
    release_cp(2, 1, run_of(1), Via::Claim { seq: c1 }, imgs[0].clone(), 1).await;

    let mut paused = Run::new(run_of(2), "a", 4)?;
    let ClaimPlan::Free(planned) = r.plan_free_claim(&o, &paused).await? else {
        panic!("the walk did not end free");
    };
    assert_eq!(planned.after, FreePoint::Entry { seq: 3 });

    let c4 = claim_after(
        &r,
        &o,
        (4, 2),
        &run_of(3),
        Some(FreePoint::Entry { seq: 3 }),
    )
    .await;
    release_cp(5, 2, run_of(3), Via::Claim { seq: c4 }, imgs[1].clone(), 2).await;
    let c7 = claim_after(
        &r,
        &o,
        (7, 3),
        &run_of(4),
        Some(FreePoint::Entry { seq: 6 }),
    )
    .await;
    let via = Via::Claim { seq: c7 };
    snap_cp(&r, &o, (8, 3), &run_of(4), &via, 1, &imgs[2], 3).await;

    let report = r.retain(&o, &old()).await?;
    assert!(report.deleted_entries.contains(&4), "{report:?}");

    let made = r.make_free_claim(planned, &mut paused).await?;
    assert!(matches!(made, FreeClaim::Lost), "{made:?}");
    let walk = r.walk_org(&o).await?;
    assert!(
        matches!(walk.state, WalkState::Entry { seq: 8 }),
        "{:?}",
        walk.state
    );
    assert_eq!(
        walk.end,
        OrgEnd::Held {
            run: run_of(4),
            end_slot: 2,
            tenure: WalkTenure { round: 3, via },
        }
    );
    assert_eq!(walk.next_round(), 4);
    assert_eq!(walk.next_seq(), 9);
    assert!(restored(&r, &o, None).await? == imgs[2]);
    Ok(())
}

/// The per-org fence rule bounded by "the log's first journal claim": a journal claim can sit
/// *below* per-org entries, in a slot 2a's retention freed (the schedule of
/// `journal_walk_attack.rs`'s third test: a K1.6 claimant paused since it read `[1]`, its
/// claim abandoned by C2). Here P (claim 1, snapshots 2 and 3, 2 deleted by 2a) is taken
/// over by a forced per-org claim Q (4) while paused; the paused journal claim lands at 2;
/// Q ships (5) and releases (6); a journal claim names that Release entry (7) and
/// checkpoints (8). T4 runs. P resumes and ships at 4, the slot after its own last entry:
/// it must be `Fenced` (Q's claim stays), never acknowledged.
#[tokio::test]
async fn a_per_org_fence_above_an_abandoned_journal_claim_in_a_freed_slot_stays() -> R {
    let store = memory();
    let o = org("acme");
    let p = open(store.clone()).await;
    let mut zombie = p.claim(&o, "p", false).await?;
    p.ship(&mut zombie, Snapshot::from_bytes(image(2, 2), 2))
        .await?;
    p.ship(&mut zombie, Snapshot::from_bytes(image(3, 3), 3))
        .await?;
    // 2a's retention of the per-org log: the older snapshot goes.
    store.delete(&log_path(&o, 2)).await?;

    let q = open(store.clone()).await;
    let mut taker = q.claim(&o, "q", true).await?;
    let taken = image(4, 4);
    q.ship(&mut taker, Snapshot::from_bytes(taken.clone(), 4))
        .await?;
    // The paused journal claimant lands in the freed slot 2 (abandoned: 3-5 lie above).
    claim_after(
        &q,
        &o,
        (2, 3),
        &run_of(7),
        Some(FreePoint::Entry { seq: 1 }),
    )
    .await;
    q.release(&mut taker).await?;
    assert_eq!(log_seqs(&store, &o).await, (1..=6).collect());

    journal_above_then_zombie_ships(&store, &o, (&p, &mut zombie), (6, 4), &taken, 4).await?;
    Ok(())
}
