//! A publish the store refused may still land late (I9): the claim stays usable, but the
//! next create that lands no longer proves no successor exists, because retention may have
//! freed that late entry's slot under a successor's claim. The claim checks once (I7, I11).

use std::sync::Arc;

use idem_replica::conformance::test_snapshot;
use idem_replica::fault::{Fault, FaultStore, Op};
use idem_replica::{
    Clock, Error, LogEntry, ManualClock, OrgId, Replica, Retention, Settings, SystemClock,
};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn log_path(seq: u64) -> Path {
    Path::from(format!("t/orgs/acme/log/{seq:020}.json"))
}

#[tokio::test(flavor = "current_thread")]
async fn a_refused_publish_that_lands_late_in_a_slot_retention_freed_is_fenced_not_acknowledged()
-> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let fs = Arc::new(FaultStore::new(raw.clone()));
    // Behind the store's clock by more than the hours it moves on, ending a minute behind
    // it: retention by age checks this host's clock against the store's (I15).
    let clock = Arc::new(ManualClock::new(
        SystemClock.now_ms() - 4 * 3_600_000 - 10_000 - 60_000,
    ));
    let settings = Settings {
        lease_ms: 1_000,
        ..Settings::default()
    };
    let acme = OrgId::new("acme")?;
    // Z: the writer that will become a zombie.
    let z = Replica::open_with(fs.clone(), "t", settings.clone(), clock.clone(), None).await?;
    let mut za = z.claim(&acme, "z", false).await?; // seq 1
    let s1 = z.ship(&mut za, test_snapshot(1)?).await?; // seq 2
    assert_eq!(s1.seq, 2);
    // The create at seq 3 fails twice and reads back empty twice: StoreRefused, claim usable.
    fs.inject_times(Op::Put, "/log/", 1, 2, Fault::FailBefore);
    let refused = z.ship(&mut za, test_snapshot(2)?).await;
    assert!(
        matches!(refused, Err(Error::StoreRefused { .. })),
        "{refused:?}"
    );
    assert!(za.unusable().is_none());
    assert_eq!(za.next_seq(), 3);
    // ... but one of those puts was only delayed, and lands now: Z's own entry at seq 3
    // (simulated: Z's snapshot of round 1 in slot 3, same shape as the refused one).
    let e2 = LogEntry::decode("x", &raw.get(&log_path(2)).await?.bytes().await?, Some(2))?;
    let mut late = e2.clone();
    late.header.seq = 3;
    late.header.nonce = "0123456789abcdef0123456789abcdef".into();
    raw.put_opts(
        &log_path(3),
        PutPayload::from(late.encode()?),
        PutMode::Create.into(),
    )
    .await?;
    // Z pauses. Its lease lapses; B claims (seq 4) and ships snapshots for over keep_ms.
    clock.advance(10_000);
    let b = Replica::open_with(raw.clone(), "t", settings.clone(), clock.clone(), None).await?;
    let mut bc = b.claim(&acme, "b", true).await?;
    assert_eq!(bc.seq(), 4);
    for i in 0..4 {
        b.ship(&mut bc, test_snapshot(10 + i)?).await?;
        clock.advance(3_600_000);
    }
    let policy = Retention {
        keep_snapshots: 2,
        keep_ms: 1_000,
        window_ms: 0,
        level_ms: 0,
    };
    let report = b.retain(&acme, &policy).await?;
    assert!(report.deleted_entries.contains(&3), "{report:?}");
    // Z resumes and ships at its next_seq (3): the slot is free again, the create lands, and
    // with no LIST after it Z is told its ship is published (it would acknowledge).
    let res = z.ship(&mut za, test_snapshot(3)?).await;
    let hist: Vec<(u64, u64, &'static str)> = b
        .history(&acme)
        .await?
        .iter()
        .map(|e| (e.seq(), e.round(), e.kind_name()))
        .collect();
    assert!(
        matches!(res, Err(Error::Fenced { .. })),
        "zombie of round 1 acknowledged a ship below round 2's claim: {res:?}\nlog: {hist:?}"
    );
    Ok(())
}
