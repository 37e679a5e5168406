//! K2.2 with the judging walk's own listing of the dead run (`Replica::adopt_run_seen`): the
//! listing picks the seal's first slot, so the adoption costs one LIST fewer, and a listing
//! the run has moved past since costs collisions, never a wrong adoption. The second listing
//! (from slot 1, always the adopter's own) decides holes and seals below ours.

mod common;

use std::sync::Arc;

use common::journal::{batch, run_of, section, writer};
use common::{R, memory, open, org};
use idem_replica::journal::{Adoption, JournalObject, Run, SealKind, Via};
use idem_replica::{OrgId, Replica};
use object_store::ObjectStore;

/// A store holding a dead writer's run (`run_of(1)`) with batches in slots 1 and 2, and
/// that writer's replica, run and org, so a test can land a late batch of it.
struct Dead {
    store: Arc<dyn ObjectStore>,
    h: Replica,
    w: Run,
    acme: OrgId,
}

async fn dead_run() -> Dead {
    let store = memory();
    let h = open(store.clone()).await;
    let acme = org("acme");
    let mut w = writer(&run_of(1), "h", 1, &[&acme]);
    for commit in [1, 2] {
        batch(
            &h,
            &mut w,
            vec![section(&acme, Via::Claim { seq: 1 }, commit)],
        )
        .await;
    }
    Dead { store, h, w, acme }
}

/// The seal's kind and its adopter at `slot` of `run`, read back from the store.
async fn seal_at(
    r: &Replica,
    run: &idem_replica::journal::RunName,
    slot: u64,
) -> R<(SealKind, String)> {
    let listing = r.list_run(run, 1).await?;
    let listed = listing
        .objects
        .get(&slot)
        .ok_or_else(|| format!("nothing at slot {slot}"))?;
    match &listed.header.object {
        JournalObject::Seal(s) => Ok((s.seal, s.by.clone())),
        other => Err(format!("slot {slot} holds {other:?}").into()),
    }
}

/// A fresh listing of the run: the adoption lists it once (its second listing), where
/// `adopt_run` lists it twice, and the seal lands at the first free slot.
#[tokio::test]
async fn a_fresh_listing_seen_saves_the_adopters_first_list() -> R {
    let Dead { store: mem, .. } = dead_run().await;
    let run1 = run_of(1);

    let d = open(mem.clone()).await;
    let seen = d.list_run(&run1, 1).await?;
    let before = d.store_requests();
    let adoption = d
        .adopt_run_seen(&run1, "d", &run_of(0xd1), 1, Some(&seen))
        .await?;
    let used = d.store_requests().since(&before);
    assert!(
        matches!(adoption, Adoption::Sealed { slot: 3, .. }),
        "{adoption:?}"
    );
    assert_eq!(
        used.list, 1,
        "LISTs of the adoption given a listing: {used:?}"
    );
    assert_eq!(seal_at(&d, &run1, 3).await?, (SealKind::Adopt, "d".into()));

    // The same adoption without one lists the run before its seal as well.
    let e = open(dead_run().await.store).await;
    let before = e.store_requests();
    e.adopt_run(&run1, "e", &run_of(0xe1), 1).await?;
    assert_eq!(e.store_requests().since(&before).list, 2);
    Ok(())
}

/// A walk's listing starts at the org's entry slot: one from above every listed floor
/// (here, above every object) could hide occupied slots below it, so it is not used and
/// the run is listed as without one.
#[tokio::test]
async fn a_listing_from_above_the_runs_floor_is_not_used() -> R {
    let Dead { store: mem, .. } = dead_run().await;
    let run1 = run_of(1);

    let d = open(mem).await;
    let above = d.list_run(&run1, 5).await?;
    let before = d.store_requests();
    let adoption = d
        .adopt_run_seen(&run1, "d", &run_of(0xd1), 1, Some(&above))
        .await?;
    assert!(
        matches!(adoption, Adoption::Sealed { slot: 3, .. }),
        "{adoption:?}"
    );
    assert_eq!(d.store_requests().since(&before).list, 2);
    Ok(())
}

/// The dead writer's late batch lands after the listing was taken: the seal's create at
/// the slot the listing showed free collides with it, and the seal goes to the next slot,
/// above that batch, as an adoption with a listing of its own would have placed it.
#[tokio::test]
async fn a_batch_landed_since_the_listing_moves_the_seal_up() -> R {
    let Dead {
        store: mem,
        h,
        mut w,
        acme,
    } = dead_run().await;
    let run1 = run_of(1);

    let d = open(mem.clone()).await;
    let seen = d.list_run(&run1, 1).await?;
    let late = batch(&h, &mut w, vec![section(&acme, Via::Claim { seq: 1 }, 3)]).await;
    assert_eq!(late, 3);
    let adoption = d
        .adopt_run_seen(&run1, "d", &run_of(0xd1), 1, Some(&seen))
        .await?;
    assert!(
        matches!(adoption, Adoption::Sealed { slot: 4, .. }),
        "{adoption:?}"
    );
    assert_eq!(seal_at(&d, &run1, 4).await?, (SealKind::Adopt, "d".into()));
    // The late batch is below the seal, where every walk reads it.
    let listing = d.list_run(&run1, 1).await?;
    let at3 = listing.objects.get(&3).ok_or("slot 3 empty")?;
    assert!(matches!(at3.header.object, JournalObject::Batch(_)));
    Ok(())
}

/// Another process adopted the run after the listing was taken: the create meets its seal
/// and the run is that process's adoption, not ours; nothing of ours lands in the run.
#[tokio::test]
async fn a_seal_placed_since_the_listing_is_met_not_passed() -> R {
    let Dead { store: mem, .. } = dead_run().await;
    let run1 = run_of(1);

    let d = open(mem.clone()).await;
    let seen = d.list_run(&run1, 1).await?;
    let e = open(mem.clone()).await;
    let theirs = e.adopt_run(&run1, "e", &run_of(0xe1), 1).await?;
    assert!(
        matches!(theirs, Adoption::Sealed { slot: 3, .. }),
        "{theirs:?}"
    );

    let ours = d
        .adopt_run_seen(&run1, "d", &run_of(0xd1), 1, Some(&seen))
        .await?;
    assert!(
        matches!(ours, Adoption::AdoptedBy { ref by, .. } if by == "e"),
        "{ours:?}"
    );
    let listing = d.list_run(&run1, 1).await?;
    assert_eq!(
        listing.objects.keys().copied().collect::<Vec<_>>(),
        vec![1, 2, 3],
        "an object of ours landed in a run another adopted"
    );
    Ok(())
}

/// Regression: our own adopt seal landed after the listing was taken (an earlier call of
/// this adopter, its outcome unseen). The create at the slot the listing showed free meets
/// it; the adoption must be found as ours (`Sealed`), as when a listing shows the seal,
/// never as another's (`AdoptedBy`), which would leave every org of the run without a
/// writer. Without the check of the met seal, this call returned `AdoptedBy { by: "d" }`.
#[tokio::test]
async fn our_own_seal_landed_since_the_listing_is_our_adoption() -> R {
    let Dead { store: mem, .. } = dead_run().await;
    let run1 = run_of(1);
    let ours = run_of(0xd1);

    let d = open(mem.clone()).await;
    let seen = d.list_run(&run1, 1).await?;
    let earlier = d.adopt_run(&run1, "d", &ours, 1).await?;
    assert!(
        matches!(earlier, Adoption::Sealed { slot: 3, .. }),
        "{earlier:?}"
    );
    let again = d.adopt_run_seen(&run1, "d", &ours, 1, Some(&seen)).await?;
    assert!(
        matches!(again, Adoption::Sealed { slot: 3, .. }),
        "our own seal read as {again:?}"
    );
    // Another adopter still sees the run as ours.
    let e = open(mem).await;
    let theirs = e.adopt_run(&run1, "e", &run_of(0xe1), 1).await?;
    assert!(
        matches!(theirs, Adoption::AdoptedBy { ref by, .. } if by == "d"),
        "{theirs:?}"
    );
    Ok(())
}
