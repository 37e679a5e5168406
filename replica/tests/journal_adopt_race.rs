//! K2.2: two adopt calls of one process race for one dead run (a retry of a call whose
//! outcome was not seen, or two acquires that did not share the gate). The second call's
//! listing was taken before the first call's seal landed, so its create meets our own seal:
//! that is our adoption, found as `Sealed`, never another's (`AdoptedBy`), which would
//! leave every org of the run without a writer. Ordered by held PUTs, without sleeps.

mod common;

use std::sync::Arc;

use common::journal::{batch, run_of, section, writer};
use common::{R, memory, open, org};
use idem_replica::fault::{FaultStore, Op};
use idem_replica::journal::{Adoption, Via};

/// Regression: before the check of the seal a create met, the second call returned
/// `AdoptedBy { by: "d" }`: this process's own adoption read as another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_meets_our_own_adopt_seal_is_our_adoption() -> R {
    let mem = memory();
    let h = open(mem.clone()).await;
    let acme = org("acme");
    let run1 = run_of(1);
    let mut w = writer(&run1, "h", 1, &[&acme]);
    for commit in [1, 2] {
        batch(
            &h,
            &mut w,
            vec![section(&acme, Via::Claim { seq: 1 }, commit)],
        )
        .await;
    }
    let faults = Arc::new(FaultStore::new(mem.clone()));
    let d = open(faults.clone()).await;
    let ours = run_of(0xd1);
    let run_path = run1.to_string();

    // The first call lists slots 1-2 and is held at its seal's PUT (slot 3).
    let first_put = faults.pause_next(Op::Put, &run_path);
    let (d1, r1, o1) = (d.clone(), run1.clone(), ours.clone());
    let first = tokio::spawn(async move { d1.adopt_run(&r1, "d", &o1, 1).await });
    first_put.reached.await?;
    // The second lists slots 1-2 too (the seal has not landed) and is held at its PUT.
    let second_put = faults.pause_next(Op::Put, &run_path);
    let (d2, r2, o2) = (d.clone(), run1.clone(), ours.clone());
    let second = tokio::spawn(async move { d2.adopt_run(&r2, "d", &o2, 1).await });
    second_put.reached.await?;

    // The first seal lands; then the second create meets it at slot 3.
    let _ = first_put.resume.send(());
    let first = first.await??;
    assert!(
        matches!(first, Adoption::Sealed { slot: 3, .. }),
        "{first:?}"
    );
    let _ = second_put.resume.send(());
    let second = second.await??;
    assert!(
        matches!(second, Adoption::Sealed { slot: 3, .. }),
        "our own seal read as {second:?}"
    );
    // Another process sees the run as ours.
    let e = open(mem).await;
    let theirs = e.adopt_run(&run1, "e", &run_of(0xe1), 1).await?;
    assert!(
        matches!(theirs, Adoption::AdoptedBy { ref by, .. } if by == "d"),
        "{theirs:?}"
    );
    Ok(())
}
