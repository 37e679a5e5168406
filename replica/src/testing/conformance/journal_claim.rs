//! K1b and K4 (`docs/design.md` 3g). Two claimants after one free point: one serves, the
//! other's create collides and its next walk ends in the winner's run. A claim with an entry
//! above it is abandoned (C2), yet later walks follow it into its claimant's run, which
//! attaches the org alone (K4). An org never written takes a checkpoint as its tenure's
//! first base, and its sections restore byte for byte.

use std::sync::Arc;

use object_store::ObjectStore;

use super::db::{Db, diff};
use super::{CaseResult, org, prefix};
use crate::format::checksum::{PageHashes, checksum_hex};
use crate::format::layout::new_nonce;
use crate::journal::{
    Base, BatchMeta, Checkpoint, CheckpointHeader, ClaimPlan, EntryCreated, FreeClaim, FreePoint,
    OrgEnd, Run, RunName, SectionInput, WalkTenure,
};
use crate::{Error, Replica, Settings, Snapshot};

fn checksum(img: &[u8]) -> Result<String, Error> {
    Ok(checksum_hex(PageHashes::of_image("image", img)?.sum()))
}

/// Announces `planned` in an empty batch of `run` and lands it.
async fn announce(
    r: &Replica,
    run: &mut Run,
    planned: &crate::journal::PlannedClaim,
) -> CaseResult {
    let meta = BatchMeta {
        claims: vec![planned.announced.clone()],
        ..BatchMeta::new(1)
    };
    let batch = r.issue_batch(run, Vec::new(), meta).await?;
    let landing = r.land_batch(&batch).await;
    run.settle(batch, landing)?;
    Ok(())
}

/// Two claimants walk one never-written org to the free point `empty` and both announce;
/// the first to create serves, the second's create collides and its next walk ends in the
/// first's run. The winner checkpoints its first state through its announcing slot and
/// journals on it; the walk restores exactly the acknowledged image.
pub(super) async fn two_claimants_after_one_free_point_one_serves_and_the_other_walks_into_it(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let a = Replica::open(store.clone(), &p, Settings::default()).await?;
    let b = Replica::open(store, &p, Settings::default()).await?;
    let o = org("acme");
    let mut ra = Run::new(RunName::new(&new_nonce()?, 1)?, "a", 4)?;
    let mut rb = Run::new(RunName::new(&new_nonce()?, 1)?, "b", 4)?;
    let (ClaimPlan::Free(pa), ClaimPlan::Free(pb)) = (
        a.plan_free_claim(&o, &ra).await?,
        b.plan_free_claim(&o, &rb).await?,
    ) else {
        return Err("a never-written org is not free".into());
    };
    assert_eq!(
        (&pa.after, &pb.after),
        (&FreePoint::Empty, &FreePoint::Empty)
    );
    announce(&a, &mut ra, &pa).await?;
    announce(&b, &mut rb, &pb).await?;
    let FreeClaim::Claimed(tenure) = a.make_free_claim(pa, &mut ra).await? else {
        return Err("the first claim lost".into());
    };
    assert_eq!(tenure.round, 1);
    assert!(matches!(
        b.make_free_claim(pb, &mut rb).await?,
        FreeClaim::Lost
    ));
    assert!(rb.holds(&o).is_err(), "the loser attached a tenure");
    let ClaimPlan::Held(walk) = b.plan_free_claim(&o, &rb).await? else {
        return Err("the org is free after a landed claim".into());
    };
    assert!(
        b.attach_own(&o, (*walk).clone(), &mut rb)?.is_none(),
        "attached an org another process holds"
    );
    assert_eq!(
        walk.end,
        OrgEnd::Held {
            run: ra.name().clone(),
            end_slot: 2,
            tenure: WalkTenure {
                round: 1,
                via: tenure.via.clone()
            }
        }
    );

    // Its first base: a checkpoint through the announcing slot; then one section on it.
    let mut db = Db::new()?;
    let base = db.image()?;
    let created = a
        .create_checkpoint(
            &o,
            Checkpoint {
                header: CheckpointHeader {
                    seq: 2,
                    round: 1,
                    writer: "a".into(),
                    run: ra.name().clone(),
                    through: 1,
                    tenure: tenure.via.clone(),
                    released: false,
                },
                snapshot: Snapshot::from_bytes(base.clone(), 0),
            },
        )
        .await?;
    assert!(matches!(created, EntryCreated::Landed(_)), "{created:?}");
    db.exec("INSERT INTO t VALUES (1, randomblob(2000))")?;
    let img = db.image()?;
    let section = SectionInput {
        org: o.clone(),
        via: tenure.via.clone(),
        base: Base {
            seq: 2,
            checksum: checksum(&base)?,
        },
        checksum: checksum(&img)?,
        pages: diff(&base, &img, 1)?,
        released: false,
    };
    let batch = a
        .issue_batch(&mut ra, vec![section], BatchMeta::new(1))
        .await?;
    let landing = a.land_batch(&batch).await;
    assert_eq!(ra.settle(batch, landing)?, vec![(o.clone(), 1)]);
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("acme.db");
    let walk = b.walk_org(&o).await?;
    assert_eq!(b.restore_walk(&o, &walk, &dest).await?, Some(1));
    assert!(std::fs::read(&dest)? == img, "not the acknowledged image");
    Ok(())
}

/// A claim that lands with an entry already above it is abandoned (C2) and attaches no
/// tenure; walks still follow it (the highest claim naming the free point) into its
/// claimant's run, so the claimant's next attempt finds the org held by its own run.
pub(super) async fn a_claim_with_an_entry_above_it_is_abandoned_and_walks_still_follow_it(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let p = prefix()?;
    let a = Replica::open(store.clone(), &p, Settings::default()).await?;
    let z = Replica::open(store, &p, Settings::default()).await?;
    let o = org("beta");
    let mut ra = Run::new(RunName::new(&new_nonce()?, 1)?, "a", 4)?;
    let ClaimPlan::Free(planned) = a.plan_free_claim(&o, &ra).await? else {
        return Err("a never-written org is not free".into());
    };
    announce(&a, &mut ra, &planned).await?;
    // Another writer's entry lands at seq 2 before the claim is made at 1.
    let above = z.create_release(&o, (2, 1), "z").await?;
    assert!(matches!(above, EntryCreated::Landed(_)), "{above:?}");
    assert!(matches!(
        a.make_free_claim(planned, &mut ra).await?,
        FreeClaim::Lost
    ));
    assert!(
        ra.holds(&o).is_err(),
        "an abandoned claim attached a tenure"
    );
    let again = a.claim_free(&o, &mut ra).await?;
    let Err(walk) = again else {
        return Err("claimed again past an abandoned claim walks follow".into());
    };
    assert!(
        matches!(&walk.end, OrgEnd::Held { run, .. } if run == ra.name()),
        "{:?}",
        walk.end
    );
    // K4: the asker is the holder; it attaches the tenure walks follow, no claim made.
    let tenure = a
        .attach_own(&o, *walk, &mut ra)?
        .ok_or("its own run's walk was not attached")?;
    assert_eq!((tenure.round, tenure.from), (1, 1));
    assert_eq!(tenure.via, crate::journal::Via::Claim { seq: 1 });
    ra.holds(&o)?;
    Ok(())
}
