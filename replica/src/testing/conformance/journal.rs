//! The journal's store protocol (`docs/design.md` 3g): batches of a run acknowledge in slot
//! order, one org's section reads back alone by a range GET, an adopt seal fences every org
//! of a dead writer's run with one PUT, an exclusion fences one org while the rest of the
//! run keeps acknowledging, a failed put ends the run with a self-seal walks follow, a
//! release seal frees, and a damaged object is a typed error (I6, I7, I9, I10, I11).

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::{CaseResult, org, prefix};
use crate::format::layout::new_nonce;
use crate::journal::{
    Adoption, Base, BatchLanding, BatchMeta, Commits, Excluded, Run, RunName, ScanEnd,
    SectionInput, Via, WalkTenure,
};
use crate::{Delta, Error, OrgId, Replica, Settings};

async fn open(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<Replica, Error> {
    Replica::open(store, prefix, Settings::default()).await
}

fn run_name() -> Result<RunName, Error> {
    RunName::new(&new_nonce()?, 1)
}

/// Pages 2 and 3 of a three-page database filled with `fill`, holding commit `commit`.
fn pages(commit: u64, fill: u8) -> Result<Delta, Error> {
    Delta::new(
        4096,
        3,
        BTreeMap::from([(2, vec![fill; 4096]), (3, vec![fill ^ 0x5a; 4096])]),
        commit,
    )
}

fn section(o: &OrgId, claim: u64, commit: u64) -> Result<SectionInput, Error> {
    Ok(SectionInput {
        org: o.clone(),
        via: Via::Claim { seq: claim },
        base: Base {
            seq: claim,
            checksum: "base".into(),
        },
        checksum: format!("after-{commit}"),
        pages: pages(commit, commit as u8)?,
        released: false,
    })
}

fn tenure(round: u64, claim: u64) -> WalkTenure {
    WalkTenure {
        round,
        via: Via::Claim { seq: claim },
    }
}

/// Issues one batch of `orgs` at `commit` and lands it; returns the commits it acknowledged.
async fn ship(r: &Replica, run: &mut Run, orgs: &[&OrgId], commit: u64) -> Result<Commits, Error> {
    let sections = orgs
        .iter()
        .map(|o| section(o, 1, commit))
        .collect::<Result<Vec<_>, _>>()?;
    let batch = r.issue_batch(run, sections, BatchMeta::new(1)).await?;
    let landing = r.land_batch(&batch).await;
    run.settle(batch, landing)
}

/// Two batches in flight land in reverse order: nothing is acknowledged until the lower
/// one has, then both at once. Each org's section reads back alone, byte for byte, and a
/// walk of each org ends at the run's end with its newest section.
pub(super) async fn journal_batches_acknowledge_in_slot_order_and_read_back_one_org_each(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let r = open(store, &prefix()?).await?;
    let (acme, beta) = (org("acme"), org("beta"));
    let mut run = Run::new(run_name()?, "a", 4)?;
    run.attach(&acme, 1)?;
    run.attach(&beta, 1)?;
    let first = r
        .issue_batch(
            &mut run,
            vec![section(&acme, 1, 1)?, section(&beta, 1, 1)?],
            BatchMeta {
                roster: Some(vec![acme.clone(), beta.clone()]),
                ..BatchMeta::new(1)
            },
        )
        .await?;
    let second = r
        .issue_batch(&mut run, vec![section(&acme, 1, 2)?], BatchMeta::new(1))
        .await?;
    assert_eq!((first.slot(), second.slot()), (1, 2));
    let landed = r.land_batch(&second).await;
    assert!(matches!(landed, BatchLanding::Landed), "{landed:?}");
    assert_eq!(
        run.settle(second, landed)?,
        vec![],
        "acked past a batch in flight"
    );
    let landed = r.land_batch(&first).await;
    let acked = run.settle(first, landed)?;
    assert_eq!(
        acked,
        vec![(acme.clone(), 1), (beta.clone(), 1), (acme.clone(), 2)]
    );
    assert_eq!(run.resolved_below(), 3);

    let listing = r.list_run(run.name(), 1).await?;
    assert_eq!(listing.objects.keys().copied().collect::<Vec<_>>(), [1, 2]);
    let walk = r.walk_runs(&beta, run.name(), 1, tenure(1, 1)).await?;
    assert_eq!(walk.end, ScanEnd::Held { end_slot: 3 });
    let (batch, s) = walk.newest.ok_or("no section of beta read")?;
    assert_eq!((batch.header.slot, s.commit), (1, 1));
    assert_eq!(
        r.read_journal_section(&batch, &s).await?,
        pages(1, 1)?.body()
    );
    let walk = r.walk_runs(&acme, run.name(), 1, tenure(1, 1)).await?;
    let (batch, s) = walk.newest.ok_or("no section of acme read")?;
    assert_eq!((batch.header.slot, s.commit), (2, 2));
    assert_eq!(
        r.read_journal_section(&batch, &s).await?,
        pages(2, 2)?.body()
    );
    // A section of another tenure (round 2) is passed over.
    let walk = r.walk_runs(&acme, run.name(), 1, tenure(2, 1)).await?;
    assert!(walk.newest.is_none());
    Ok(())
}

/// A dead writer's run is fenced for every org by one adopt seal placed above its landed
/// batches: its next batch collides with the seal and acknowledges nothing, ever; every
/// org's walk crosses the seal into the adopter's run with round + 1 and keeps the newest
/// acknowledged section.
pub(super) async fn an_adopt_seal_fences_every_org_of_a_run_with_one_put(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let a = open(store.clone(), &p).await?;
    let b = open(store, &p).await?;
    let (acme, beta) = (org("acme"), org("beta"));
    let mut run = Run::new(run_name()?, "a", 4)?;
    run.attach(&acme, 1)?;
    run.attach(&beta, 1)?;
    assert_eq!(ship(&a, &mut run, &[&acme, &beta], 1).await?.len(), 2);
    // The zombie's next batch is issued but not yet landed when the adopter seals.
    let late = a
        .issue_batch(&mut run, vec![section(&acme, 1, 2)?], BatchMeta::new(1))
        .await?;

    let theirs = run_name()?;
    let before = b.store_requests();
    let adoption = b.adopt_run(run.name(), "b", &theirs, 1).await?;
    let cost = b.store_requests().since(&before);
    let Adoption::Sealed { slot, .. } = adoption else {
        return Err(format!("not sealed: {adoption:?}").into());
    };
    assert_eq!(
        slot, 2,
        "the seal goes at the lowest free slot above the floor"
    );
    assert_eq!(cost.put, 1, "one PUT fences the whole run: {cost:?}");

    let landing = a.land_batch(&late).await;
    assert!(matches!(landing, BatchLanding::Taken(_)), "{landing:?}");
    assert!(matches!(
        run.settle(late, landing),
        Err(Error::RunFenced { slot: 2, .. })
    ));
    assert!(matches!(run.holds(&beta), Err(Error::RunFenced { .. })));
    assert!(
        a.issue_batch(&mut run, vec![section(&beta, 1, 3)?], BatchMeta::new(1))
            .await
            .is_err()
    );
    for o in [&acme, &beta] {
        let walk = b.walk_runs(o, run.name(), 1, tenure(1, 1)).await?;
        assert_eq!(
            walk.end,
            ScanEnd::Held { end_slot: 1 },
            "ends in the adopter's run"
        );
        assert_eq!(walk.visited.last().map(|(_, l)| &l.run), Some(&theirs));
        assert_eq!(walk.tenure.round, 2);
        let (batch, s) = walk.newest.ok_or("the acknowledged section is lost")?;
        assert_eq!((batch.header.slot, s.commit), (1, 1));
    }
    // A second adopter finds the run adopted; it places nothing.
    let again = b.adopt_run(run.name(), "c", &run_name()?, 1).await?;
    assert!(matches!(again, Adoption::AdoptedBy { slot: 2, ref by, .. } if by == "b"));
    Ok(())
}

/// A claimant's exclusion of one org fences that org's tenure at the exclusion's slot; the
/// holder's batch that collides with it acknowledges nothing, and its other orgs go on in
/// the next batch, acknowledged. The claimant's re-walk reaches its exclusion and serves;
/// an exclusion that is not above the walk's round is refused.
pub(super) async fn an_exclusion_fences_one_org_and_the_run_keeps_acknowledging_the_rest(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let a = open(store.clone(), &p).await?;
    let c = open(store, &p).await?;
    let (acme, beta) = (org("acme"), org("beta"));
    let mut run = Run::new(run_name()?, "a", 4)?;
    run.attach(&acme, 1)?;
    run.attach(&beta, 1)?;
    ship(&a, &mut run, &[&acme, &beta], 1).await?;

    let walk = c.walk_runs(&acme, run.name(), 1, tenure(1, 1)).await?;
    let (entry, listing) = walk.visited.last().ok_or("no run visited")?.clone();
    let theirs = run_name()?;
    assert!(
        c.exclude(&acme, 9, 1, &theirs, 1, "c", &listing, entry, &walk.tenure)
            .await
            .is_err(),
        "an exclusion of the walk's own round fences nothing"
    );
    let placed = c
        .exclude(&acme, 9, 2, &theirs, 1, "c", &listing, entry, &walk.tenure)
        .await?;
    let Excluded::Serves { slot, .. } = placed else {
        return Err(format!("the claimant does not serve: {placed:?}").into());
    };
    assert_eq!(slot, 2);

    // The holder had two batches in flight: the one at slot 2 collides (resolved, nothing
    // acknowledged, acme fenced there), the one at slot 3 lands and acknowledges beta only.
    let mut flight = Vec::new();
    for commit in [2, 3] {
        let sections = vec![section(&acme, 1, commit)?, section(&beta, 1, commit)?];
        flight.push(a.issue_batch(&mut run, sections, BatchMeta::new(1)).await?);
    }
    let at3 = flight.pop().ok_or("no batch")?;
    let at2 = flight.pop().ok_or("no batch")?;
    let landed = a.land_batch(&at3).await;
    assert_eq!(run.settle(at3, landed)?, vec![]);
    let collided = a.land_batch(&at2).await;
    assert!(matches!(collided, BatchLanding::Taken(_)), "{collided:?}");
    assert_eq!(run.settle(at2, collided)?, vec![(beta.clone(), 3)]);
    assert!(matches!(
        run.holds(&acme),
        Err(Error::Fenced { theirs: 2, .. })
    ));
    assert!(run.holds(&beta).is_ok());
    assert!(
        a.issue_batch(&mut run, vec![section(&acme, 1, 3)?], BatchMeta::new(1))
            .await
            .is_err(),
        "a fenced tenure writes no section"
    );
    assert_eq!(
        ship(&a, &mut run, &[&beta], 4).await?,
        vec![(beta.clone(), 4)]
    );

    // Walks: acme hops to the claimant's run in round 2; beta stays with the holder.
    let walk = c.walk_runs(&acme, run.name(), 1, tenure(1, 1)).await?;
    assert_eq!(walk.tenure, tenure(2, 9));
    assert_eq!(walk.visited.last().map(|(_, l)| &l.run), Some(&theirs));
    assert_eq!(walk.newest.map(|(_, s)| s.commit), Some(1));
    let walk = c.walk_runs(&beta, run.name(), 1, tenure(1, 1)).await?;
    assert_eq!(walk.end, ScanEnd::Held { end_slot: 5 });
    assert_eq!(walk.newest.map(|(_, s)| s.commit), Some(4));
    // A new tenure of acme in the holder's run, of a round below the exclusion's, is fenced
    // at birth (J2).
    assert!(matches!(run.attach(&acme, 1), Err(Error::Fenced { .. })));
    Ok(())
}

/// A batch whose put fails ends the run: once nothing is in flight, a self-seal goes at
/// the lowest unresolved slot (above a later batch that landed, which is then never
/// acknowledged), the continued run acknowledges the commit again, and walks follow the
/// seal. A release seal after a drain ends the walk free.
pub(super) async fn a_failed_batch_ends_the_run_with_a_self_seal_that_walks_follow(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let r = open(store, &prefix()?).await?;
    let acme = org("acme");
    let mut run = Run::new(run_name()?, "a", 4)?;
    run.attach(&acme, 1)?;
    ship(&r, &mut run, &[&acme], 1).await?;
    let lost = r
        .issue_batch(&mut run, vec![section(&acme, 1, 2)?], BatchMeta::new(1))
        .await?;
    let above = r
        .issue_batch(&mut run, vec![section(&acme, 1, 3)?], BatchMeta::new(1))
        .await?;
    let landed = r.land_batch(&above).await;
    assert_eq!(run.settle(above, landed)?, vec![]);
    let failed = BatchLanding::Failed(Error::InvalidSettings {
        reason: "injected: the put failed".into(),
    });
    assert_eq!(run.settle(lost, failed)?, vec![]);
    assert!(run.needs_seal());
    assert!(
        r.issue_batch(&mut run, vec![section(&acme, 1, 4)?], BatchMeta::new(1))
            .await
            .is_err(),
        "nothing is issued after a failure (J3.1)"
    );
    let (mut next, acked) = r.seal_self(&mut run, 1).await?;
    assert_eq!(acked, vec![]);
    assert_eq!(next.name(), &run.name().next());
    let listing = r.list_run(run.name(), 1).await?;
    assert_eq!(
        listing.objects.keys().copied().collect::<Vec<_>>(),
        [1, 2, 3]
    );
    // The continued run carries the tenure; the commits go again (cumulative sections).
    assert_eq!(
        ship(&r, &mut next, &[&acme], 3).await?,
        vec![(acme.clone(), 3)]
    );
    let walk = r.walk_runs(&acme, run.name(), 1, tenure(1, 1)).await?;
    assert_eq!(walk.visited.len(), 2);
    assert_eq!(walk.newest.map(|(_, s)| s.commit), Some(3));
    // The batch above the seal (commit 3 in the sealed run) was never read: the one read
    // is the continued run's.
    let release = r.seal_release(&mut next, 1).await?;
    assert_eq!(release, 2);
    let walk = r.walk_runs(&acme, run.name(), 1, tenure(1, 1)).await?;
    assert_eq!(walk.end, ScanEnd::Released { slot: 2 });
    Ok(())
}

/// A damaged or misplaced journal object is a typed error for every reader, and a create
/// that collides with it does not take it for its own.
pub(super) async fn a_damaged_journal_object_is_a_typed_error(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let r = open(store.clone(), &p).await?;
    let acme = org("acme");
    let mut run = Run::new(run_name()?, "a", 4)?;
    run.attach(&acme, 1)?;
    ship(&r, &mut run, &[&acme], 1).await?;
    let path = |slot: u64| Path::from(format!("{p}/journals/{}/{slot:020}.jnl", run.name()));
    let good = store.get(&path(1)).await?.bytes().await?;

    // A copy of slot 1 at slot 2 names another slot than its path.
    store.put(&path(2), PutPayload::from(good.clone())).await?;
    assert!(matches!(
        r.list_run(run.name(), 1).await,
        Err(Error::Corrupt { .. })
    ));
    store.delete(&path(2)).await?;
    // A flipped byte in the section's frame: the header reads, the section does not.
    let mut bad = good.to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    store.put(&path(1), PutPayload::from(bad)).await?;
    let walk = r.walk_runs(&acme, run.name(), 1, tenure(1, 1)).await?;
    let (batch, s) = walk.newest.ok_or("no section")?;
    assert!(matches!(
        r.read_journal_section(&batch, &s).await,
        Err(Error::Corrupt { .. })
    ));
    // Garbage in the next slot: the writer's create there is a typed error, never a landing.
    store
        .put(&path(2), PutPayload::from(b"not a journal object".to_vec()))
        .await?;
    let batch = r
        .issue_batch(&mut run, vec![section(&acme, 1, 2)?], BatchMeta::new(1))
        .await?;
    let landing = r.land_batch(&batch).await;
    assert!(
        matches!(landing, BatchLanding::Failed(Error::Corrupt { .. })),
        "{landing:?}"
    );
    Ok(())
}

/// The database checksum of a canonical image, as sections name it.
fn checksum(img: &[u8]) -> Result<String, Error> {
    Ok(crate::format::checksum::checksum_hex(
        crate::format::checksum::PageHashes::of_image("image", img)?.sum(),
    ))
}

/// A writer holding two orgs journals three commits of each (cumulative sections from each
/// org's snapshot) and has a fourth in flight when it dies. One adopt seal fences the run;
/// each org's walk crosses into the adopter's run, and its newest section applied to its
/// base installs the last acknowledged database byte for byte, never the one in flight.
pub(super) async fn a_dead_writers_acknowledged_state_restores_from_its_journal_byte_for_byte(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    use super::db::{Db, diff};
    let p = prefix()?;
    let a = open(store.clone(), &p).await?;
    let b = open(store, &p).await?;
    let mut run = Run::new(run_name()?, "a", 4)?;
    let mut held = Vec::new();
    for name in ["acme", "beta"] {
        let o = org(name);
        let mut claim = a.claim(&o, "a", false).await?;
        let mut db = Db::new()?;
        db.exec("INSERT INTO t VALUES (1, randomblob(3000))")?;
        let base_img = db.image()?;
        let base = a
            .ship(&mut claim, crate::Snapshot::from_bytes(base_img.clone(), 1))
            .await?;
        run.attach(&o, claim.round())?;
        held.push((o, claim, db, base_img, base.seq));
    }
    let mut acked_images: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut images = BTreeMap::new();
    type Held = Vec<(OrgId, crate::Claim, Db, Vec<u8>, u64)>;
    type Images = BTreeMap<(String, u64), Vec<u8>>;
    let next_batch = |held: &mut Held,
                      images: &mut Images,
                      commit: u64|
     -> Result<Vec<SectionInput>, Box<dyn std::error::Error + Send + Sync>> {
        let mut sections = Vec::new();
        for (o, claim, db, base_img, base_seq) in held.iter_mut() {
            db.exec(&format!(
                "INSERT INTO t VALUES ({commit}, randomblob(1500)); UPDATE t SET v = randomblob(40) WHERE id = 1"
            ))?;
            let img = db.image()?;
            sections.push(SectionInput {
                org: o.clone(),
                via: Via::Claim { seq: claim.seq() },
                base: Base {
                    seq: *base_seq,
                    checksum: checksum(base_img)?,
                },
                checksum: checksum(&img)?,
                pages: diff(base_img, &img, commit)?,
                released: false,
            });
            images.insert((o.to_string(), commit), img);
        }
        Ok(sections)
    };
    for commit in 2..=4 {
        let batch = a
            .issue_batch(
                &mut run,
                next_batch(&mut held, &mut images, commit)?,
                BatchMeta::new(1),
            )
            .await?;
        let landing = a.land_batch(&batch).await;
        for (o, c) in run.settle(batch, landing)? {
            let img = images.get(&(o.to_string(), c)).ok_or("no image")?;
            acked_images.insert(o.to_string(), img.clone());
        }
    }
    let late = a
        .issue_batch(
            &mut run,
            next_batch(&mut held, &mut images, 5)?,
            BatchMeta::new(1),
        )
        .await?;
    let theirs = run_name()?;
    let adoption = b.adopt_run(run.name(), "b", &theirs, 1).await?;
    assert!(
        matches!(adoption, Adoption::Sealed { slot: 4, .. }),
        "{adoption:?}"
    );
    let landing = a.land_batch(&late).await;
    assert!(
        run.settle(late, landing).is_err(),
        "the late batch is fenced"
    );

    let dir = tempfile::tempdir()?;
    for (o, claim, ..) in &held {
        let walk = b
            .walk_runs(o, run.name(), 1, tenure(claim.round(), claim.seq()))
            .await?;
        assert_eq!(walk.visited.last().map(|(_, l)| &l.run), Some(&theirs));
        let (batch, section) = walk.newest.ok_or("no section read")?;
        let dest = dir.path().join(format!("{o}.db"));
        assert_eq!(b.restore_section(o, &batch, &section, &dest).await?, 4);
        let want = acked_images.get(o.as_str()).ok_or("nothing acknowledged")?;
        assert!(
            std::fs::read(&dest)? == *want,
            "{o}: not the acknowledged image"
        );
        // Read as another org's, it is refused and nothing is installed.
        let other = dir.path().join("other.db");
        assert!(
            b.restore_section(&org("gamma"), &batch, &section, &other)
                .await
                .is_err()
        );
        assert!(!other.exists());
    }
    Ok(())
}

/// Lands a batch of `sections` with `meta`; returns its slot.
async fn land(
    r: &Replica,
    run: &mut Run,
    sections: Vec<SectionInput>,
    meta: BatchMeta,
) -> Result<u64, Error> {
    let batch = r.issue_batch(run, sections, meta).await?;
    let slot = batch.slot();
    let landing = r.land_batch(&batch).await;
    run.settle(batch, landing)?;
    Ok(slot)
}

/// An adopter learns a run's orgs from the newest roster, read back along the chain's self
/// seals when the newest run holds none, plus every org with a section or an announced
/// claim after it (K2.3); with a roster in the newest run, the earlier runs are not read.
pub(super) async fn an_adopter_learns_every_org_from_the_newest_roster_back_along_self_seals(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let a = open(store.clone(), &p).await?;
    let b = open(store, &p).await?;
    let [acme, beta, gamma, delta, omega] = ["acme", "beta", "gamma", "delta", "omega"].map(org);
    let mut run = Run::new(run_name()?, "a", 4)?;
    for o in [&acme, &beta, &gamma] {
        run.attach(o, 1)?;
    }
    let roster = BatchMeta {
        roster: Some(vec![acme.clone(), beta.clone()]),
        ..BatchMeta::new(1)
    };
    assert_eq!(
        land(&a, &mut run, vec![section(&acme, 1, 1)?], roster).await?,
        1
    );
    let announced = crate::journal::Announced {
        org: delta.to_string(),
        run: run.name().clone(),
        from: 2,
    };
    let meta = BatchMeta {
        claims: vec![announced.clone()],
        ..BatchMeta::new(1)
    };
    land(&a, &mut run, vec![section(&gamma, 1, 2)?], meta).await?;
    // A failed put ends the run; the continued run's batch carries no roster here.
    let lost = a
        .issue_batch(&mut run, vec![section(&acme, 1, 3)?], BatchMeta::new(1))
        .await?;
    let failed = BatchLanding::Failed(Error::InvalidSettings {
        reason: "injected: the put failed".into(),
    });
    run.settle(lost, failed)?;
    let (mut next, _) = a.seal_self(&mut run, 1).await?;
    next.attach(&omega, 1)?;
    land(
        &a,
        &mut next,
        vec![section(&omega, 1, 1)?],
        BatchMeta::new(1),
    )
    .await?;

    let theirs = run_name()?;
    let Adoption::Sealed {
        run: sealed,
        slot,
        listing,
    } = b.adopt_run(run.name(), "b", &theirs, 1).await?
    else {
        return Err("not sealed".into());
    };
    assert_eq!(&sealed, next.name(), "the adoption follows the self seal");
    let learned = b.run_orgs(&listing, slot).await?;
    let want: std::collections::BTreeSet<OrgId> = [&acme, &beta, &gamma, &delta, &omega]
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(learned.orgs, want);
    assert_eq!(learned.claims, vec![announced]);
    assert_eq!(learned.roster, Some((run.name().clone(), 1)));

    // A roster in the newest run is enough: nothing before it is read.
    let mut third = Run::new(run_name()?, "c", 4)?;
    third.attach(&beta, 1)?;
    let roster = BatchMeta {
        roster: Some(vec![beta.clone()]),
        ..BatchMeta::new(1)
    };
    land(&a, &mut third, vec![section(&beta, 1, 1)?], roster).await?;
    let listing = b.list_run(third.name(), 1).await?;
    let learned = b.run_orgs(&listing, u64::MAX).await?;
    assert_eq!(
        learned.orgs.into_iter().collect::<Vec<_>>(),
        vec![beta.clone()]
    );
    Ok(())
}

/// Retention of a run deletes batches below every walk's entry (the newest batch's
/// `retain_below`, capped by the highest floor and the newest roster), only once older than
/// `keep_ms`, never an exclusion or a seal; walks from the kept entry still read the newest
/// section. After a release seal whose value is its own slot, every batch goes and the seal
/// and the exclusion stay.
pub(super) async fn run_retention_deletes_only_below_every_entry_and_keeps_fences(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let a = open(store.clone(), &p).await?;
    let c = open(store, &p).await?;
    let acme = org("acme");
    let mut run = Run::new(run_name()?, "a", 4)?;
    run.attach(&acme, 1)?;
    land(&a, &mut run, vec![section(&acme, 1, 1)?], BatchMeta::new(1)).await?;
    land(&a, &mut run, vec![section(&acme, 1, 2)?], BatchMeta::new(1)).await?;
    // A claimant's exclusion of another org lands at slot 3; the holder's batch collides.
    let zeta = crate::journal::Exclusion {
        org: "zeta".into(),
        claim: 4,
        round: 2,
        continued: run_name()?,
        from: 1,
        by: "c".into(),
    };
    let listing = c.list_run(run.name(), 1).await?;
    let placed = c
        .place_fence(&listing, 1, crate::journal::JournalObject::Exclusion(zeta))
        .await?;
    assert!(matches!(
        placed,
        crate::journal::Placement::Placed { slot: 3, .. }
    ));
    assert_eq!(
        land(&a, &mut run, vec![section(&acme, 1, 3)?], BatchMeta::new(1)).await?,
        3
    );
    for commit in 4..=6 {
        let meta = BatchMeta {
            roster: (commit == 6).then(|| vec![acme.clone()]),
            ..BatchMeta::new(5)
        };
        land(&a, &mut run, vec![section(&acme, 1, commit)?], meta).await?;
    }
    // Slots: 1, 2 batches; 3 the exclusion (the holder's commit 3 collided with it and goes
    // with the next batch); 4-6 batches (commits 4-6), the roster at 6.
    let young = a.retain_run(run.name(), 3_600_000).await?;
    assert_eq!(
        (young.deleted.len(), young.young, young.retain_below),
        (0, 3, 5)
    );
    let done = a.retain_run(run.name(), 0).await?;
    assert_eq!(done.deleted, vec![1, 2, 4]);
    let kept = a.list_run(run.name(), 1).await?;
    assert_eq!(kept.objects.keys().copied().collect::<Vec<_>>(), [3, 5, 6]);
    let walk = a.walk_runs(&acme, run.name(), 5, tenure(1, 1)).await?;
    assert_eq!(walk.newest.map(|(_, s)| s.commit), Some(6));

    let end = a.seal_release(&mut run, 7).await?;
    assert_eq!(end, 7);
    let all = a.retain_run(run.name(), 0).await?;
    assert_eq!(all.deleted, vec![5, 6]);
    let kept = a.list_run(run.name(), 1).await?;
    assert_eq!(kept.objects.keys().copied().collect::<Vec<_>>(), [3, 7]);

    // A value above the run's highest floor (a writer's slip, or a crafted batch) is capped
    // by it: a paused writer may still create there (T1). With a roster below, by the
    // roster: an adopter reads it and after (T2).
    for (roster_at, want) in [(None, vec![1, 2]), (Some(2), vec![1])] {
        let mut other = Run::new(run_name()?, "a", 4)?;
        other.attach(&acme, 1)?;
        for commit in 1..=3 {
            let meta = BatchMeta {
                roster: (Some(commit) == roster_at).then(|| vec![acme.clone()]),
                ..BatchMeta::new(10)
            };
            land(&a, &mut other, vec![section(&acme, 1, commit)?], meta).await?;
        }
        assert_eq!(a.retain_run(other.name(), 0).await?.deleted, want);
    }
    Ok(())
}
