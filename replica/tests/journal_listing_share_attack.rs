//! An attack on shared run listings (commit 705cea6, `docs/design.md` 3g "The walk"):
//! `journal/coalesce.rs` (`RunListings`: a walk reads a listing whose LIST began after the
//! walk began; listings of one run one at a time; a walk entering lower lists from there),
//! `journal/headers.rs` (`SealedListings`: a sealed run's gap-free part up to its first seal
//! serves every later walk entering in it) and `Listed::sections_of` (a batch's sections by
//! org). Every schedule is forced at exact store requests (a LIST held at a gate, a hook run
//! just before one GET), never ordered by sleeping, and every walk on the handle under attack
//! is compared with the same walk on a fresh handle that lists for itself.

#![allow(clippy::unwrap_used, clippy::too_many_lines, missing_docs)]

mod common;

use std::sync::{Arc, Mutex};

use common::interpose::{Interpose, gate};
use common::journal::{
    batch, batch_meta, claim, claim_after, create_object, exclusion_obj, jpath, run_of, section,
    tenure, writer,
};
use common::{R, memory, open, org};
use idem_replica::journal::*;
use idem_replica::{Error, OrgId, Replica};
use object_store::ObjectStore;
use sha2::{Digest, Sha256};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// The prefix of `run`'s objects: what a LIST of the run is gated on.
fn jdir(run: &RunName) -> String {
    format!("journals/{run}")
}

/// An adopt seal by "adopter" of `continued`'s instance, continuing in it from `from`.
fn adopt_seal(continued: &RunName, from: u64) -> JournalObject {
    JournalObject::Seal(Seal {
        by: "adopter".into(),
        instance: continued.instance().to_owned(),
        seal: SealKind::Adopt,
        continued: Some(continued.clone()),
        from,
        retain_below: 0,
    })
}

/// A crafted object's header, its nonce unique to its run and slot.
fn header(run: &RunName, slot: u64, floor: u64, object: JournalObject) -> JournalHeader {
    JournalHeader {
        nonce: format!("crafted-{slot}-{}", rand_tag(run, slot)),
        ..common::journal::header(run, slot, floor, object)
    }
}

/// Four bytes of hex from `run` and `slot`.
fn rand_tag(run: &RunName, slot: u64) -> String {
    let d = Sha256::digest(format!("{run}/{slot}"));
    d.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// What a walk decided: the runs it entered and where, its end, its tenure and the newest
/// section it read (run, slot, commit).
#[derive(Debug, PartialEq, Eq)]
struct Decided {
    visited: Vec<(String, u64)>,
    end: ScanEnd,
    tenure: WalkTenure,
    newest: Option<(String, u64, u64)>,
}

fn decided(walk: &Result<Walk, Error>) -> Result<Decided, String> {
    match walk {
        Ok(w) => Ok(Decided {
            visited: w
                .visited
                .iter()
                .map(|(e, l)| (l.run.to_string(), *e))
                .collect(),
            end: w.end.clone(),
            tenure: w.tenure.clone(),
            newest: w
                .newest
                .as_ref()
                .map(|(l, s)| (l.header.run.to_string(), l.header.slot, s.commit)),
        }),
        Err(e) => Err(format!("{e}")),
    }
}

/// What an org's walk decided.
fn org_decided(walk: &Result<OrgWalk, Error>) -> Result<String, String> {
    match walk {
        Ok(w) => {
            let runs: Vec<Decided> = w
                .runs
                .iter()
                .map(|r| decided(&Ok(r.clone())).unwrap())
                .collect();
            let state = match &w.state {
                WalkState::Section { batch, section } => format!(
                    "section {}/{} commit {}",
                    batch.header.run, batch.header.slot, section.commit
                ),
                other => format!("{other:?}"),
            };
            Ok(format!(
                "{runs:?} | {state} | {:?} | round {}",
                w.end, w.highest_round
            ))
        }
        Err(e) => Err(format!("{e}")),
    }
}

/// `x`'s walk of `o`, asserted to decide what the same walk on a fresh handle decides (after
/// `step`): what it decided.
async fn org_agrees_with_fresh(
    x: &Replica,
    raw: &Arc<dyn ObjectStore>,
    o: &OrgId,
    step: &str,
) -> Result<String, String> {
    let walked = org_decided(&x.walk_org(o).await);
    let fresh = org_decided(&open(raw.clone()).await.walk_org(o).await);
    assert_eq!(walked, fresh, "{step}");
    walked
}

/// The same walk on a handle with no shared listings: what the store says now.
async fn fresh_walk(
    store: &Arc<dyn ObjectStore>,
    o: &OrgId,
    run: &RunName,
    entry: u64,
    t: WalkTenure,
) -> Result<Decided, String> {
    decided(&open(store.clone()).await.walk_runs(o, run, entry, t).await)
}

/// `b`'s walk of `o` entering `run` at `entry` in tenure (1, 1), asserted to decide what the
/// same walk on a fresh handle decides.
async fn agrees_with_fresh(
    b: &Replica,
    raw: &Arc<dyn ObjectStore>,
    o: &OrgId,
    run: &RunName,
    entry: u64,
) {
    let walked = decided(&b.walk_runs(o, run, entry, tenure(1, 1)).await);
    assert_eq!(
        walked,
        fresh_walk(raw, o, run, entry, tenure(1, 1)).await,
        "entry {entry}"
    );
}

/// A handle on `raw` through an [`Interpose`] (recording its LISTs and GETs), and that store.
async fn spied_handle(raw: &Arc<dyn ObjectStore>) -> (Arc<Interpose>, Replica) {
    let spied = Interpose::new(raw.clone());
    let b = open(spied.clone()).await;
    (spied, b)
}

/// H (window 4) holding `o` and `p` in A: A/1 (`o`, commit 1) landed, A/2 (`o`, commit 2)
/// issued and in flight, A/3 (`third`, commit 3) landed, and `adopter`'s seal at A/4. H and
/// its batch in flight at 2.
async fn hole_below_an_adopt_seal(
    (w, raw): (&Replica, &Arc<dyn ObjectStore>),
    (a, adopter): (&RunName, &RunName),
    (o, p): (&OrgId, &OrgId),
    third: &OrgId,
) -> R<(Run, IssuedBatch)> {
    let mut h = writer(a, "h", 1, &[o, p]);
    batch(w, &mut h, vec![section(o, claim(1), 1)]).await;
    let late = w
        .issue_batch(&mut h, vec![section(o, claim(1), 2)], BatchMeta::new(1))
        .await?;
    let third = w
        .issue_batch(&mut h, vec![section(third, claim(1), 3)], BatchMeta::new(1))
        .await?;
    assert!(matches!(w.land_batch(&third).await, BatchLanding::Landed));
    create_object(raw, &header(a, 4, 2, adopt_seal(adopter, 1))).await;
    Ok((h, late))
}

// ---------------------------------------------------------------------------------------
// Finding 1: a walk lists from the lowest slot any earlier walk of the run entered at
// ---------------------------------------------------------------------------------------

/// Writer H holds `p` and `q` in run R (round 1, claim 1). Handle B walks `p` from slot 1
/// while R holds only slot 1 (B's LIST of R is from 1). H lands slots 2-5; slot 5's header
/// says every entry is at 5 or above (both orgs checkpointed through 4), so T3 lets retention
/// delete slots 1-4. B walks `q` from its entry 5: the walk must list R from 5, as its own
/// LIST would, reading no header below 5: retention deletes slots 1-4 at the moment B would
/// GET the header of slot 3 if it listed R from the kept listing's start (1), which would
/// fail the walk with `MissingObject`. B's walk must agree with a fresh handle's (commit 5).
#[tokio::test]
async fn a_walk_above_retention_reads_nothing_below_its_entry_after_a_lower_walk() -> R {
    let raw = memory();
    let w = open(raw.clone()).await;
    let (p, q) = (org("p"), org("q"));
    let run = run_of(1);
    let mut h = writer(&run, "h", 1, &[&p, &q]);
    batch(
        &w,
        &mut h,
        vec![section(&p, claim(1), 1), section(&q, claim(1), 1)],
    )
    .await;

    let (spied, b) = spied_handle(&raw).await;
    agrees_with_fresh(&b, &raw, &p, &run, 1).await;

    for c in 2..=4 {
        batch(
            &w,
            &mut h,
            vec![section(&p, claim(1), c), section(&q, claim(1), c)],
        )
        .await;
    }
    batch_meta(
        &w,
        &mut h,
        vec![section(&q, claim(1), 5)],
        BatchMeta::new(5),
    )
    .await;

    // Retention of R (another process) runs between B's LIST and B's GET of slot 3.
    let retainer = w.clone();
    let retained_run = run.clone();
    let deleted = Arc::new(Mutex::new(Vec::new()));
    let seen = deleted.clone();
    spied.before_get(
        jpath(&run, 3),
        Box::pin(async move {
            let r = retainer.retain_run(&retained_run, 0).await.unwrap();
            *seen.lock().unwrap() = r.deleted;
        }),
    );
    let walked = decided(&b.walk_runs(&q, &run, 5, tenure(1, 1)).await);
    let fresh = fresh_walk(&raw, &q, &run, 5, tenure(1, 1)).await;
    let deleted = deleted.lock().unwrap().clone();
    eprintln!("retention deleted {deleted:?} (all below the walk's entry 5)");
    assert!(deleted.iter().all(|s| *s < 5));
    assert_eq!(
        walked, fresh,
        "a walk of q entering R at 5 listed R from slot 1 (an earlier walk's entry) and failed on \
         retention below its own entry"
    );
    Ok(())
}

/// The cost side of the same rule, with nothing deleted: after one walk entered R at 1, a
/// walk entering at 5 makes the LIST and header GETs its own walk would (after slot 4, one
/// header), not a LIST from slot 1 with GETs of headers 2-4 it never scans (at 1,000 orgs,
/// about 250 KB each once they left the 64 MiB header cache).
#[tokio::test]
async fn a_walk_lists_from_its_own_entry_not_from_an_earlier_walks_lower_one() -> R {
    let raw = memory();
    let w = open(raw.clone()).await;
    let (p, q) = (org("p"), org("q"));
    let run = run_of(1);
    let mut h = writer(&run, "h", 1, &[&p, &q]);
    batch(&w, &mut h, vec![section(&p, claim(1), 1)]).await;

    let (spied, b) = spied_handle(&raw).await;
    b.walk_runs(&p, &run, 1, tenure(1, 1)).await?;
    for c in 2..=5 {
        batch(&w, &mut h, vec![section(&q, claim(1), c)]).await;
    }

    spied.take_gets();
    spied.take_lists();
    let walked = decided(&b.walk_runs(&q, &run, 5, tenure(1, 1)).await);
    let (b_lists, b_gets) = (spied.take_lists(), spied.take_gets());

    let (own, f) = spied_handle(&raw).await;
    own.take_gets();
    own.take_lists();
    let fresh = decided(&f.walk_runs(&q, &run, 5, tenure(1, 1)).await);
    let (f_lists, f_gets) = (own.take_lists(), own.take_gets());

    assert_eq!(walked, fresh);
    eprintln!("shared: LIST {b_lists:?}, GET {b_gets:?}");
    eprintln!("own:    LIST {f_lists:?}, GET {f_gets:?}");
    assert_eq!(
        (b_lists, b_gets),
        (f_lists, f_gets),
        "the walk entering at 5 listed and read headers below its entry"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Finding 2: a later hop reads a listing older than the object that led there
// ---------------------------------------------------------------------------------------

/// H holds `o` in run A (a section at A/1). C holds `p` in run Cr (Cr/1). On handle B:
/// 1. walk W of `o` from A/1 begins; its LIST of A is held at a gate;
/// 2. a walk of `p` (begun after W) lists Cr: [1];
/// 3. C's put fails and C self-seals Cr at slot 2 (continued Cr2), then its claim of `o`
///    (seq 7, round 2, naming Cr from 1, made before the seal) gets its exclusion at A/2;
///    C serves `o` and acknowledges commit 20 at Cr2/1;
/// 4. W's LIST of A runs: it sees the exclusion and hops to Cr at 1, where step 2's listing
///    (its LIST began after W did) lacks the self-seal that landed **before** the exclusion
///    that sent W there.
///
/// No instant had "the exclusion in A, Cr unsealed": each hop's listing must begin after
/// the hop was decided, so W, like its own LIST of Cr after reading A, ends in Cr2 with
/// commit 20, acknowledged before W's LIST of A ran (reading step 2's listing it would end
/// held in Cr with H's state).
#[tokio::test]
async fn a_later_hop_never_reads_a_listing_older_than_the_exclusion_that_led_there() -> R {
    let raw = memory();
    let w = open(raw.clone()).await;
    let (o, p) = (org("o"), org("p"));
    let (a, cr) = (run_of(0xa), run_of(0xc));
    let mut h = writer(&a, "h", 1, &[&o]);
    batch(&w, &mut h, vec![section(&o, claim(1), 1)]).await;
    let mut c = writer(&cr, "c", 1, &[&p]);
    batch(&w, &mut c, vec![section(&p, claim(1), 10)]).await;

    let (spied, b) = spied_handle(&raw).await;
    let (g, arrived, go) = gate();
    spied.gate_list(jdir(&a), g);
    let mut walk = Box::pin(b.walk_runs(&o, &a, 1, tenure(1, 1)));
    assert!(futures::poll!(walk.as_mut()).is_pending());
    arrived.await?;

    // Another org's walk on B lists Cr (after W began).
    b.walk_runs(&p, &cr, 1, tenure(1, 1)).await?;

    // C self-seals Cr, its exclusion of o lands in A, it serves o in Cr2.
    let (mut c2, _) = w.seal_self(&mut c, 1).await?;
    assert_eq!(c2.name(), &cr.next());
    create_object(&raw, &header(&a, 2, 2, exclusion_obj(&o, 7, 2, &cr, 1))).await;
    c2.attach(&o, 2)?;
    batch(&w, &mut c2, vec![section(&o, claim(7), 20)]).await;

    go.send(()).unwrap();
    let walked = decided(&walk.await);
    let fresh = fresh_walk(&raw, &o, &a, 1, tenure(1, 1)).await;
    eprintln!("shared: {walked:?}\nown:    {fresh:?}");
    assert_eq!(
        walked, fresh,
        "the walk read Cr's listing from before its self-seal, which landed before the \
         exclusion that led the walk into Cr"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Clauses checked and found sound
// ---------------------------------------------------------------------------------------

/// SealedListings, J3-4's hole: H (window 4) has A/1 (o, commit 1) landed, A/2 (o, commit 2)
/// in flight, A/3 (p) landed; an adopter's seal lands at A/4. Handle B walks `o` from 1
/// (listing 1, 3, seal 4: the kept part is [3, 4]). Then H's late batch lands in the hole at
/// 2, inside H's prefix below the seal (acknowledged). B's next walk from 1 must read commit
/// 2; a walk from 3 is served by the kept part and must agree with a fresh walk too.
#[tokio::test]
async fn a_hole_below_an_adopt_seal_filled_by_the_dead_writers_late_batch_is_read() -> R {
    let raw = memory();
    let w = open(raw.clone()).await;
    let (o, p) = (org("o"), org("p"));
    let (a, adopter) = (run_of(0xa), run_of(0xad));
    let (_h, late) = hole_below_an_adopt_seal((&w, &raw), (&a, &adopter), (&o, &p), &p).await?;

    let b = open(raw.clone()).await;
    for entry in [1, 3] {
        agrees_with_fresh(&b, &raw, &o, &a, entry).await;
    }

    assert!(matches!(w.land_batch(&late).await, BatchLanding::Landed));
    for entry in [1, 2, 3, 4] {
        agrees_with_fresh(&b, &raw, &o, &a, entry).await;
    }
    let from1 = decided(&b.walk_runs(&o, &a, 1, tenure(1, 1)).await).unwrap();
    assert_eq!(from1.newest, Some((a.to_string(), 2, 2)));
    Ok(())
}

/// SealedListings, adopt_run's `fill_holes`: the same run, but the hole at 2 is filled by
/// the adopter's second seal instead. Walks from 1 must meet the second seal (a tenure via
/// slot 2), whatever B kept from its listing with the hole.
#[tokio::test]
async fn a_second_seal_filling_a_hole_below_a_kept_listing_is_met() -> R {
    let raw = memory();
    let w = open(raw.clone()).await;
    let (o, p) = (org("o"), org("p"));
    let (a, adopter) = (run_of(0xa), run_of(0xad));
    let (_h, _never) = hole_below_an_adopt_seal((&w, &raw), (&a, &adopter), (&o, &p), &o).await?;
    // The adopter's run, with an attach section of o via the seal at 2 (the lowest of its).
    let mut i = writer(&adopter, "adopter", 2, &[&o]);

    let b = open(raw.clone()).await;
    agrees_with_fresh(&b, &raw, &o, &a, 1).await;

    // fill_holes: a second seal, same body, at 2.
    create_object(&raw, &header(&a, 2, 2, adopt_seal(&adopter, 1))).await;
    batch(
        &w,
        &mut i,
        vec![section(
            &o,
            Via::Adopt {
                run: a.clone(),
                slot: 2,
            },
            30,
        )],
    )
    .await;
    for entry in [1, 2, 3] {
        agrees_with_fresh(&b, &raw, &o, &a, entry).await;
    }
    Ok(())
}

/// RunListings: walk W1 of `p` lists A on handle B; its LIST returned [1] and W1 is held at
/// its header GET of slot 1 (still inside the run's one-at-a-time LIST). An exclusion of `o`
/// (round 2, naming Cr) lands at A/2; then walk W2 of `o` begins on B and waits for the
/// run's LIST. W2 must not read W1's listing (begun before W2): it ends in Cr with commit 40.
#[tokio::test]
async fn a_walk_begun_after_an_exclusion_landed_never_reads_a_listing_without_it() -> R {
    let raw = memory();
    let w = open(raw.clone()).await;
    let (o, p) = (org("o"), org("p"));
    let (a, cr) = (run_of(0xa), run_of(0xc));
    let mut h = writer(&a, "h", 1, &[&o, &p]);
    batch(
        &w,
        &mut h,
        vec![section(&o, claim(1), 1), section(&p, claim(1), 1)],
    )
    .await;
    let mut c = writer(&cr, "c", 2, &[&o]);
    batch(&w, &mut c, vec![section(&o, claim(7), 40)]).await;

    let (spied, b) = spied_handle(&raw).await;
    let (g, arrived, go) = gate();
    spied.before_get(jpath(&a, 1), g);
    let mut w1 = Box::pin(b.walk_runs(&p, &a, 1, tenure(1, 1)));
    assert!(futures::poll!(w1.as_mut()).is_pending());
    arrived.await?;

    create_object(&raw, &header(&a, 2, 2, exclusion_obj(&o, 7, 2, &cr, 1))).await;
    let mut w2 = Box::pin(b.walk_runs(&o, &a, 1, tenure(1, 1)));
    assert!(futures::poll!(w2.as_mut()).is_pending());
    go.send(()).unwrap();
    let (r1, r2) = futures::join!(w1, w2);
    assert_eq!(decided(&r1).unwrap().end, ScanEnd::Held { end_slot: 2 });
    let walked = decided(&r2);
    assert_eq!(walked, fresh_walk(&raw, &o, &a, 1, tenure(1, 1)).await);
    assert_eq!(walked.unwrap().newest, Some((cr.to_string(), 1, 40)));
    Ok(())
}

/// `sections_of` past 16 sections (the index), with every org's walk sharing one listing:
/// 20 orgs in one batch, odd orgs again in the next, an exclusion of org 3 at slot 3, then a
/// batch of every org (org 3's there is of the fenced tenure). Each org's walk on one handle,
/// all at once, agrees with a fresh handle's, in its own tenure and in a tenure nobody has.
#[tokio::test]
async fn twenty_orgs_sharing_listings_each_find_their_own_section() -> R {
    let raw = memory();
    let w = open(raw.clone()).await;
    let orgs: Vec<OrgId> = (0..20).map(|i| org(&format!("org{i:02}"))).collect();
    let (a, cr) = (run_of(0xa), run_of(0xc));
    let mut h = Run::new(a.clone(), "h", 8)?;
    for o in &orgs {
        h.attach(o, 1)?;
    }
    let all = |commit: u64| -> Vec<SectionInput> {
        orgs.iter()
            .enumerate()
            .map(|(i, o)| section(o, claim(1), commit * 100 + i as u64))
            .collect()
    };
    batch(&w, &mut h, all(1)).await;
    let odd: Vec<SectionInput> = orgs
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(i, o)| section(o, claim(1), 200 + i as u64))
        .collect();
    batch(&w, &mut h, odd).await;
    create_object(
        &raw,
        &header(&a, 3, 3, exclusion_obj(&orgs[3], 9, 2, &cr, 1)),
    )
    .await;
    // H resolves slot 3 as the exclusion; its next batch goes at 4.
    let taken = w.issue_batch(&mut h, Vec::new(), BatchMeta::new(1)).await?;
    let l = w.land_batch(&taken).await;
    h.settle(taken, l)?;
    let fourth: Vec<SectionInput> = orgs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3)
        .map(|(i, o)| section(o, claim(1), 400 + i as u64))
        .collect();
    batch(&w, &mut h, fourth).await;

    let b = open(raw.clone()).await;
    for t in [tenure(1, 1), tenure(5, 5)] {
        let walks =
            futures::future::join_all(orgs.iter().map(|o| b.walk_runs(o, &a, 1, t.clone()))).await;
        for (o, walked) in orgs.iter().zip(&walks) {
            assert_eq!(
                decided(walked),
                fresh_walk(&raw, o, &a, 1, t.clone()).await,
                "{o} in {t:?}"
            );
        }
    }
    Ok(())
}

/// SealedListings and retention: H holds `o` and `p` in A; B walks `o` from 1 (a legal
/// entry then) and keeps A's listing up to H's self-seal at 4. Both orgs go on in A2; the
/// seal's `retain_below` is 3 (both orgs checkpointed through 2), so retention deletes A/1
/// and A/2; a paused claimant's late exclusion of `o` lands in the freed slot 1 (below every
/// entry). Walks entering A at 3 and 4 on B agree with fresh ones, and so does a walk from
/// A2/1.
#[tokio::test]
async fn a_kept_sealed_listing_outlives_retention_below_every_entry() -> R {
    let raw = memory();
    let w = open(raw.clone()).await;
    let (o, p) = (org("o"), org("p"));
    let (a, cr) = (run_of(0xa), run_of(0xc));
    let mut h = writer(&a, "h", 1, &[&o, &p]);
    for c in 1..=3 {
        batch(
            &w,
            &mut h,
            vec![section(&o, claim(1), c), section(&p, claim(1), c)],
        )
        .await;
    }
    let (mut h2, _) = w.seal_self(&mut h, 3).await?;

    let b = open(raw.clone()).await;
    agrees_with_fresh(&b, &raw, &o, &a, 1).await;

    batch(&w, &mut h2, vec![section(&o, claim(1), 50)]).await;
    let retained = w.retain_run(&a, 0).await?;
    assert_eq!(retained.deleted, vec![1, 2]);
    create_object(&raw, &header(&a, 1, 1, exclusion_obj(&o, 9, 2, &cr, 1))).await;

    for entry in [3, 4] {
        agrees_with_fresh(&b, &raw, &o, &a, entry).await;
    }
    let a2 = a.next();
    agrees_with_fresh(&b, &raw, &p, &a2, 1).await;
    Ok(())
}

/// K0 over the log, a release seal followed by claimants: `o` is claimed after `empty` into
/// A (claim 1), released by H's release seal at A/3; B claims it after that seal into Br
/// (claim 2, round 2) and acknowledges; handle X walks `o` (keeping A's sealed listing and
/// sharing Br's). Then B self-seals Br at Br/2 and acknowledges in Br2/1; D claims `o`
/// (claim 3, round 3), its exclusion lands at Br2/2 and D acknowledges in Dr. After each
/// step X's walk agrees with a fresh handle's.
#[tokio::test]
async fn a_release_seal_then_two_claimants_walk_alike_on_a_kept_listing() -> R {
    let raw = memory();
    let w = open(raw.clone()).await;
    let o = org("o");
    let (a, br, dr) = (run_of(0xa), run_of(0xb), run_of(0xd));
    claim_after(&w, &o, (1, 1), &a, Some(FreePoint::Empty)).await;
    let mut h = writer(&a, "h", 1, &[&o]);
    for c in 1..=2 {
        batch(&w, &mut h, vec![section(&o, claim(1), c)]).await;
    }
    let seal = w.seal_release(&mut h, 1).await?;
    assert_eq!(seal, 3);

    let x = open(raw.clone()).await;
    org_agrees_with_fresh(&x, &raw, &o, "released")
        .await
        .unwrap();

    let after_seal = FreePoint::Seal {
        run: a.clone(),
        slot: 3,
    };
    claim_after(&w, &o, (2, 2), &br, Some(after_seal)).await;
    let mut bw = writer(&br, "b", 2, &[&o]);
    batch(&w, &mut bw, vec![section(&o, claim(2), 60)]).await;
    org_agrees_with_fresh(&x, &raw, &o, "claimed after the seal")
        .await
        .unwrap();

    let (mut bw2, _) = w.seal_self(&mut bw, 1).await?;
    batch(&w, &mut bw2, vec![section(&o, claim(2), 61)]).await;
    org_agrees_with_fresh(&x, &raw, &o, "the claimant's run self-sealed")
        .await
        .unwrap();

    claim_after(&w, &o, (3, 3), &dr, None).await;
    create_object(
        &raw,
        &header(&br.next(), 2, 2, exclusion_obj(&o, 3, 3, &dr, 1)),
    )
    .await;
    let mut dw = writer(&dr, "d", 3, &[&o]);
    batch(&w, &mut dw, vec![section(&o, claim(3), 70)]).await;
    let last = org_agrees_with_fresh(&x, &raw, &o, "excluded by a second claimant").await;
    assert!(last.unwrap().contains("commit 70"));
    Ok(())
}
