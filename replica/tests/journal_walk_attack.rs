//! An attack on K0 from an org's log and the restores by base links (`docs/design.md` 3g,
//! "The walk", "Readers and retention"): crafted format-5 entries written as raw bytes,
//! zombie claims in freed slots, cycles through free points, tampered sections and bases,
//! and per-org readers and writers meeting a journal org. Each test names the guarantee it
//! holds; the ones that failed before their fix say so.

#![allow(clippy::unwrap_used, clippy::too_many_lines, missing_docs)]

mod common;

use std::path::Path as FsPath;
use std::sync::Arc;

use common::journal::{
    claim_after, cp_header, header, image, image_section, landed, log_path, put_object, run_of,
    seal_obj, settled_batch, writer,
};
use common::{R, memory, objects, open, org};
use idem_replica::journal::*;
use idem_replica::{Error, OrgId, Replica, Retention, Snapshot};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

const MAX: u64 = u64::MAX;

/// `o`'s log entry `seq` as JSON.
async fn raw(store: &Arc<dyn ObjectStore>, o: &OrgId, seq: u64) -> serde_json::Value {
    let bytes = store.get(&log_path(o, seq)).await.unwrap().bytes().await;
    serde_json::from_slice(&bytes.unwrap()).unwrap()
}

/// Writes `entry` as `o`'s log entry `seq`, over whatever is there.
async fn put_raw(store: &Arc<dyn ObjectStore>, o: &OrgId, seq: u64, entry: &serde_json::Value) {
    store
        .put(
            &log_path(o, seq),
            PutPayload::from(serde_json::to_vec(entry).unwrap()),
        )
        .await
        .unwrap();
}

/// A snapshot checkpoint of writer "j" at `seq` in round `round`, in `run` through slot 1
/// in the tenure `via`, of `img` at commit 1: its seq.
async fn checkpoint(
    r: &Replica,
    o: &OrgId,
    seq_round: (u64, u64),
    run: &RunName,
    via: Via,
    released: bool,
    img: &[u8],
) -> u64 {
    let header = cp_header(seq_round, run, &via, 1, released);
    common::journal::checkpoint(r, o, header, img, 1).await
}

/// Nothing at `dest` and nothing beside it (no temp file, no sidecar).
fn nothing_installed(dir: &FsPath, dest: &FsPath) {
    assert!(!dest.exists(), "{} installed", dest.display());
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left beside the destination: {left:?}");
}

/// A released checkpoint at the last seq a log name can hold: the walk has no Release entry
/// above it to look for, so it goes on in its run. (It panicked on `seq + 1`; without
/// overflow checks it wrapped and took a Release entry *below* the checkpoint as its own,
/// ending the walk free.)
#[tokio::test]
async fn a_released_checkpoint_at_the_last_seq_walks_its_run_not_a_panic() {
    let store = memory();
    let r = open(store.clone()).await;
    let o = org("acme");
    let run = run_of(1);
    let c = claim_after(&r, &o, (1, 1), &run, Some(FreePoint::Empty)).await;
    let via = Via::Claim { seq: c };
    checkpoint(&r, &o, (2, 1), &run, via.clone(), true, &image(3, 3)).await;
    // A Release entry of the same round below it, and the checkpoint moved to the top.
    landed(r.create_release(&o, (3, 1), "j").await.unwrap());
    let mut top = raw(&store, &o, 2).await;
    top["seq"] = MAX.into();
    put_raw(&store, &o, MAX, &top).await;
    store.delete(&log_path(&o, 2)).await.unwrap();
    let walk = tokio::spawn({
        let (r, o) = (r.clone(), o.clone());
        async move { r.walk_org(&o).await }
    })
    .await
    .expect("the walk panicked")
    .unwrap();
    assert!(
        matches!(walk.state, WalkState::Entry { seq: MAX }),
        "{:?}",
        walk.state
    );
    assert_eq!(
        walk.end,
        OrgEnd::Held {
            run,
            end_slot: 2,
            tenure: WalkTenure { round: 1, via },
        }
    );
}

/// A per-org claim at the last seq: the segment's Release entry is looked for above it
/// without overflowing; the claim's process holds the org. (It panicked.)
#[tokio::test]
async fn a_per_org_claim_at_the_last_seq_is_held_per_org_not_a_panic() {
    let store = memory();
    let r = open(store.clone()).await;
    let o = org("acme");
    let claim = serde_json::json!({
        "at_ms": 1, "kind": "claim", "nonce": "n", "round": 1, "seq": MAX, "v": 1, "writer": "w"
    });
    put_raw(&store, &o, MAX, &claim).await;
    let walk = tokio::spawn({
        let (r, o) = (r.clone(), o.clone());
        async move { r.walk_org(&o).await }
    })
    .await
    .expect("the walk panicked")
    .unwrap();
    assert_eq!(
        walk.end,
        OrgEnd::HeldPerOrg {
            claim: MAX,
            round: 1
        }
    );
    assert!(matches!(walk.state, WalkState::Empty), "{:?}", walk.state);
}

/// A per-org history (claim 1, snapshots 2 and 3) whose snapshot 2 retention deleted, and a
/// K1.6 claimant paused since it read the log as `[1]`: its claim naming `after: 1` lands in
/// the freed slot 2, below the holder's snapshot 3 of the round it meant to fence. C2 finds
/// 3 above it and abandons it. Walks must read it as 3e reads a claim in a freed slot under
/// the owner's newer entries (shadowed, `Window::newest`): the segment goes on to its own
/// end. (The walk followed the abandoned claim into its empty run and called the org
/// never written: state `Empty`, so `restore_walk` installed nothing.)
#[tokio::test]
async fn an_abandoned_takeover_claim_in_a_freed_slot_under_the_holders_entries_is_not_followed() -> R
{
    let store = memory();
    let r = open(store.clone()).await;
    let o = org("acme");
    let mut claim = r.claim(&o, "a", false).await?;
    r.ship(&mut claim, Snapshot::from_bytes(image(2, 2), 2))
        .await?;
    let img = image(5, 5);
    let newest = r
        .ship(&mut claim, Snapshot::from_bytes(img.clone(), 5))
        .await?;
    assert_eq!(newest.seq, 3);
    store.delete(&log_path(&o, 2)).await?;
    let zombie = run_of(7);
    claim_after(&r, &o, (2, 2), &zombie, Some(FreePoint::Entry { seq: 1 })).await;

    // The holder still holds it per org, at its snapshot 3.
    let walk = r.walk_org(&o).await?;
    assert_eq!(walk.end, OrgEnd::HeldPerOrg { claim: 1, round: 1 });
    assert!(
        matches!(walk.state, WalkState::Entry { seq: 3 }),
        "{:?}",
        walk.state
    );
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("acme.db");
    assert_eq!(r.restore_walk(&o, &walk, &dest).await?, Some(5));
    assert!(std::fs::read(&dest)? == Snapshot::from_bytes(img, 5).bytes());

    // It releases (Release entry 4): the walk ends free there, and a K1b claim naming that
    // point continues it; the abandoned claim below never enters.
    r.release(&mut claim).await?;
    let walk = r.walk_org(&o).await?;
    assert_eq!(walk.end, OrgEnd::Free(FreePoint::Entry { seq: 4 }));
    assert!(matches!(walk.state, WalkState::Entry { seq: 3 }));
    let run = run_of(8);
    let c = claim_after(&r, &o, (5, 3), &run, Some(FreePoint::Entry { seq: 4 })).await;
    let walk = r.walk_org(&o).await?;
    assert_eq!(
        walk.end,
        OrgEnd::Held {
            run,
            end_slot: 1,
            tenure: WalkTenure {
                round: 3,
                via: Via::Claim { seq: c },
            },
        }
    );
    assert!(matches!(walk.state, WalkState::Entry { seq: 3 }));
    Ok(())
}

/// A claim after a release seal whose run is the sealed run itself, from below the seal: the
/// walk re-enters the run, meets the same seal, is at the same free point again. It stops
/// after a bounded number of hops with a typed error, never loops.
#[tokio::test]
async fn a_claim_after_a_release_seal_that_leads_back_into_it_is_corrupt_not_a_loop() {
    let store = memory();
    let r = open(store.clone()).await;
    let o = org("acme");
    let run = run_of(1);
    put_object(
        &store,
        &header(&run, 1, 1, seal_obj(SealKind::Release, None, 1)),
    )
    .await;
    claim_after(&r, &o, (1, 1), &run, Some(FreePoint::Empty)).await;
    let seal = FreePoint::Seal {
        run: run.clone(),
        slot: 1,
    };
    claim_after(&r, &o, (2, 2), &run, Some(seal)).await;
    let walked = tokio::time::timeout(std::time::Duration::from_secs(60), r.walk_org(&o))
        .await
        .expect("the walk did not end");
    assert!(matches!(walked, Err(Error::Corrupt { .. })), "{walked:?}");
}

/// One journaled org: claim 1 after `empty` into `run`, an empty batch at slot 1, a
/// checkpoint at 2 through it, and a batch at slot 2 with one section on that checkpoint,
/// whose after-checksum is `lie` when given.
async fn journaled(
    r: &Replica,
    o: &OrgId,
    run: u64,
    lie: Option<&str>,
) -> (RunName, Vec<u8>, Vec<u8>) {
    let run = run_of(run);
    let c = claim_after(r, o, (1, 1), &run, Some(FreePoint::Empty)).await;
    let via = Via::Claim { seq: c };
    let mut w = writer(&run, "j", 1, &[o]);
    settled_batch(r, &mut w, vec![]).await;
    let base = Snapshot::from_bytes(image(2, 2), 1).bytes().to_vec();
    checkpoint(r, o, (2, 1), &run, via.clone(), false, &base).await;
    let next = Snapshot::from_bytes(image(4, 4), 2).bytes().to_vec();
    let mut section = image_section(o, &via, (2, &base), &next, 2);
    if let Some(lie) = lie {
        section.checksum = lie.to_owned();
    }
    let b = r
        .issue_batch(&mut w, vec![section], BatchMeta::new(1))
        .await
        .unwrap();
    let l = r.land_batch(&b).await;
    assert_eq!(w.settle(b, l).unwrap().len(), 1);
    (run, base, next)
}

/// I10 for a walk's section: a base entry swapped for another image after the section was
/// written, or a section whose pages do not lead to the checksum it names, is `ChainBroken`
/// with nothing at the destination and no temp file beside it; an untouched one restores
/// byte for byte.
#[tokio::test]
async fn a_tampered_base_or_section_installs_nothing_and_leaves_no_temp_file() {
    let store = memory();
    let r = open(store.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("org.db");

    let o = org("acme");
    let (_, _, next) = journaled(&r, &o, 1, None).await;
    let walk = r.walk_org(&o).await.unwrap();
    assert!(
        matches!(walk.state, WalkState::Section { .. }),
        "{:?}",
        walk.state
    );
    assert_eq!(r.restore_walk(&o, &walk, &dest).await.unwrap(), Some(2));
    assert!(
        std::fs::read(&dest).unwrap() == next,
        "not the section's image"
    );
    std::fs::remove_file(&dest).unwrap();

    // The base: the checkpoint at 2 rewritten to name another database.
    let other = org("other");
    checkpoint(
        &r,
        &other,
        (1, 1),
        &run_of(9),
        Via::Claim { seq: 1 },
        false,
        &image(3, 3),
    )
    .await;
    let mut swapped = raw(&store, &other, 1).await;
    let mut theirs = raw(&store, &o, 2).await;
    for k in ["manifest", "sha256", "bytes", "compressed_bytes"] {
        theirs[k] = swapped[k].take();
    }
    // The other org's segments, moved under this org.
    use futures::TryStreamExt;
    let snap: Vec<_> = store
        .list(Some(&Path::from("orgs/other/snap")))
        .try_collect()
        .await
        .unwrap();
    for m in snap {
        let to = Path::from(m.location.as_ref().replacen("orgs/other/", "orgs/acme/", 1));
        store.copy(&m.location, &to).await.unwrap();
    }
    put_raw(&store, &o, 2, &theirs).await;
    let walk = r.walk_org(&o).await.unwrap();
    let refused = r.restore_walk(&o, &walk, &dest).await;
    assert!(
        matches!(refused, Err(Error::ChainBroken { .. })),
        "{refused:?}"
    );
    nothing_installed(dir.path(), &dest);

    // The section: its pages lead elsewhere than the checksum it names.
    let liar = org("liar");
    journaled(&r, &liar, 2, Some("0000000000000000")).await;
    let walk = r.walk_org(&liar).await.unwrap();
    let refused = r.restore_walk(&liar, &walk, &dest).await;
    assert!(
        matches!(refused, Err(Error::ChainBroken { .. })),
        "{refused:?}"
    );
    nothing_installed(dir.path(), &dest);
}

/// A checkpoint delta whose `base` link is itself, points up, or names a claim: restoring
/// the walk's state is a typed error before anything is written beside the destination.
#[tokio::test]
async fn a_checkpoint_delta_linking_to_itself_upward_or_to_a_claim_is_refused() {
    let store = memory();
    let r = open(store.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("org.db");
    let o = org("acme");
    let run = run_of(1);
    let c = claim_after(&r, &o, (1, 1), &run, Some(FreePoint::Empty)).await;
    checkpoint(
        &r,
        &o,
        (2, 1),
        &run,
        Via::Claim { seq: c },
        false,
        &image(2, 2),
    )
    .await;
    let snap = raw(&store, &o, 2).await;
    for (base, corrupt) in [(3, true), (9, true), (1, false)] {
        let mut delta = snap.clone();
        let m = delta.as_object_mut().unwrap();
        m.remove("manifest");
        m.insert("blob".into(), "00000000000000000003-x.delta.zst".into());
        m.insert("kind".into(), "delta".into());
        m.insert("seq".into(), 3.into());
        m.insert("base".into(), base.into());
        m.insert("base_checksum".into(), "0000000000000000".into());
        m.insert("checksum".into(), "0000000000000000".into());
        m.insert("page_size".into(), 4096.into());
        m.insert("db_pages".into(), 2.into());
        m.insert("changed_pages".into(), 1.into());
        m["journal"]["through"] = 2.into();
        put_raw(&store, &o, 3, &delta).await;
        let walk = r.walk_org(&o).await.unwrap();
        assert!(
            matches!(walk.state, WalkState::Entry { seq: 3 }),
            "{:?}",
            walk.state
        );
        let refused = r.restore_walk(&o, &walk, &dest).await;
        match refused {
            Err(Error::Corrupt { .. }) if corrupt => {}
            Err(Error::NoSuchSnapshot { seq: 1, .. }) if !corrupt => {}
            other => panic!("base {base}: {other:?}"),
        }
        nothing_installed(dir.path(), &dest);
    }
}

/// K0's start is the newest checkpoint by (round, seq): a zombie's checkpoint of a lower
/// round landing above it, or a checkpoint of the same round below it, does not move it; a
/// released checkpoint frees the org only at a Release entry of its own round.
#[tokio::test]
async fn the_newest_checkpoint_is_by_round_then_seq_and_frees_only_at_its_own_release() {
    let store = memory();
    let r = open(store.clone()).await;
    let o = org("acme");
    let (run1, run2) = (run_of(1), run_of(2));
    let c1 = claim_after(&r, &o, (1, 1), &run1, Some(FreePoint::Empty)).await;
    checkpoint(
        &r,
        &o,
        (2, 1),
        &run1,
        Via::Claim { seq: c1 },
        false,
        &image(1, 1),
    )
    .await;
    let c2 = claim_after(&r, &o, (3, 2), &run2, None).await;
    let via2 = Via::Claim { seq: c2 };
    checkpoint(&r, &o, (4, 2), &run2, via2.clone(), false, &image(2, 2)).await;
    let img = image(3, 3);
    let newest = checkpoint(&r, &o, (5, 2), &run2, via2.clone(), true, &img).await;
    // The round-1 writer, fenced, still creates its checkpoint and its Release above.
    checkpoint(
        &r,
        &o,
        (6, 1),
        &run1,
        Via::Claim { seq: c1 },
        true,
        &image(4, 4),
    )
    .await;
    landed(r.create_release(&o, (7, 1), "j").await.unwrap());
    let walk = r.walk_org(&o).await.unwrap();
    assert!(
        matches!(walk.state, WalkState::Entry { seq } if seq == newest),
        "{:?}",
        walk.state
    );
    assert_eq!(
        walk.end,
        OrgEnd::Held {
            run: run2.clone(),
            end_slot: 2,
            tenure: WalkTenure {
                round: 2,
                via: via2
            },
        },
        "freed by another round's Release entry"
    );
    assert_eq!(walk.highest_round, 2);
    // Its own round's Release entry frees it there.
    landed(r.create_release(&o, (8, 2), "j").await.unwrap());
    let walk = r.walk_org(&o).await.unwrap();
    assert_eq!(walk.end, OrgEnd::Free(FreePoint::Entry { seq: 8 }));
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("org.db");
    assert_eq!(r.restore_walk(&o, &walk, &dest).await.unwrap(), Some(1));
    assert!(std::fs::read(&dest).unwrap() == Snapshot::from_bytes(img, 1).bytes());
}

/// K3 against the per-org path: once a journal claim took over a per-org holder (K1.6),
/// the holder's next ship meets it in its slot and is `Fenced`, never acknowledged; and
/// every per-org writer-side reader (level compaction, a forced claim), on the
/// holder's handle that remembers the per-org entries and on a fresh one, refuses the log
/// with `JournalRequired`, deleting and writing nothing; `verify`, `restore` and retention
/// follow the journal (verify finds every entry and the takeover's state sound; retention,
/// T4, deletes no entry younger than `keep_ms`, only the fenced ship's orphan objects).
#[tokio::test]
async fn per_org_writers_and_readers_meeting_a_journal_takeover_are_fenced_or_refused() {
    let store = memory();
    let holder = open(store.clone()).await;
    let o = org("acme");
    let mut claim = holder.claim(&o, "a", false).await.unwrap();
    holder
        .ship(&mut claim, Snapshot::from_bytes(image(2, 2), 2))
        .await
        .unwrap();
    // Retention on the holder's handle remembers both entries.
    holder.retain(&o, &Retention::default()).await.unwrap();
    let run = run_of(1);
    let c = claim_after(&holder, &o, (3, 2), &run, Some(FreePoint::Entry { seq: 1 })).await;
    let taken_over = image(3, 3);
    checkpoint(
        &holder,
        &o,
        (4, 2),
        &run,
        Via::Claim { seq: c },
        false,
        &taken_over,
    )
    .await;

    let fenced = holder
        .ship(&mut claim, Snapshot::from_bytes(image(3, 3), 3))
        .await;
    assert!(
        matches!(
            fenced,
            Err(Error::Fenced {
                ours: 1,
                theirs: 2,
                ..
            })
        ),
        "{fenced:?}"
    );
    let again = holder
        .ship(&mut claim, Snapshot::from_bytes(image(3, 3), 3))
        .await;
    assert!(again.is_err(), "a fenced claim shipped again: {again:?}");

    // Retention follows the journal (T4): no entry is old enough to go, and the fenced
    // ship's objects at 3 (the journal claim's slot, which does not name them) are orphans.
    let young = holder.retain(&o, &Retention::default()).await.unwrap();
    assert!(young.deleted_entries.is_empty(), "{young:?}");
    assert_eq!(young.deleted_blobs.len(), 2, "{young:?}");
    assert!(
        young
            .deleted_blobs
            .iter()
            .all(|b| b.starts_with("orgs/acme/snap/00000000000000000003-1-")),
        "{young:?}"
    );
    let before = objects(&store).await;
    let fresh = open(store.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("org.db");
    for r in [&holder, &fresh] {
        // `verify` reads journal orgs: every stored entry and the walk's state rebuild.
        let report = r.verify(&o).await.unwrap();
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert!(!report.ok.is_empty(), "verify checked nothing");
        let refusals = [
            r.compact_levels(&o, &Retention::default()).await.err(),
            r.claim(&o, "b", true).await.err(),
        ];
        for (i, refused) in refusals.into_iter().enumerate() {
            assert!(
                matches!(refused, Some(Error::JournalRequired { .. })),
                "reader {i}: {refused:?}"
            );
        }
        nothing_installed(dir.path(), &dest);
    }
    assert_eq!(
        objects(&store).await,
        before,
        "a per-org reader changed the store"
    );
    // `restore` follows the journal: the takeover's checkpoint.
    let restored = fresh.restore(&o, None, &dest).await.unwrap();
    assert_eq!(restored.position, Some(4));
    assert!(
        std::fs::read(&dest).unwrap() == taken_over,
        "not the checkpoint's state"
    );
}
