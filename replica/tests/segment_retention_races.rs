//! Retention against snapshots whose entries land after it read the log: a zombie's
//! snapshot landing late in a slot retention freed is fenced and never names objects the
//! run deleted (I7, I11).

use std::sync::{Arc, Mutex};

use idem_replica::conformance::test_snapshot;
use idem_replica::fault::{Fault, FaultStore, Op};
use idem_replica::{
    Clock, Error, FailPoint, Failpoints, LogEntry, ManualClock, OrgId, Replica, Retention,
    Settings, SystemClock,
};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn log_path(seq: u64) -> Path {
    Path::from(format!("t/orgs/acme/log/{seq:020}.json"))
}

/// Runs one retention run (of another handle) when the hooked ship has uploaded everything
/// and not yet created its entry.
#[derive(Debug, Default)]
struct RetainAfterUpload {
    armed: Mutex<Option<(Replica, OrgId, Retention)>>,
}

#[async_trait::async_trait]
impl Failpoints for RetainAfterUpload {
    async fn hit(&self, point: FailPoint, _org: &OrgId) -> Result<(), String> {
        if point != FailPoint::ShipAfterUpload {
            return Ok(());
        }
        let armed = self.armed.lock().map_err(|e| e.to_string())?.take();
        if let Some((r, org, policy)) = armed {
            r.retain(&org, &policy).await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// The zombie of `refused_publish.rs`, with segments: a refused snapshot of Z landed late in
/// slot 3, retention freed that slot under B's claim, and Z's next snapshot goes to slot 3
/// again. Its segments and manifest are named with seq 3, below the head, so a retention run
/// between Z's uploads and Z's create deletes them as orphans; then Z's create lands in the
/// freed slot (Z is fenced, nothing is acknowledged) and stays in the log: a kept snapshot
/// entry naming a deleted manifest. Verify reported it as damage, and every later retention
/// run that reached it deleted no segment at all until the entry expired. A claim in doubt
/// now looks above its last entry before it creates, and Z is fenced without landing.
#[tokio::test(flavor = "current_thread")]
async fn a_zombie_snapshot_landing_in_a_freed_slot_never_names_deleted_objects() -> R {
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
    let hook = Arc::new(RetainAfterUpload::default());
    let z = Replica::open_with(
        fs.clone(),
        "t",
        settings.clone(),
        clock.clone(),
        Some(hook.clone()),
    )
    .await?;
    let mut za = z.claim(&acme, "z", false).await?; // seq 1
    let s1 = z.ship(&mut za, test_snapshot(1)?).await?; // seq 2
    assert_eq!(s1.seq, 2);
    fs.inject_times(Op::Put, "/log/", 1, 2, Fault::FailBefore);
    let refused = z.ship(&mut za, test_snapshot(2)?).await;
    assert!(
        matches!(refused, Err(Error::StoreRefused { .. })),
        "{refused:?}"
    );
    // One of the refused puts lands late in slot 3 (as in refused_publish.rs).
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
    clock.advance(10_000);
    let b = Replica::open_with(raw.clone(), "t", settings.clone(), clock.clone(), None).await?;
    let mut bc = b.claim(&acme, "b", true).await?;
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
    // Z resumes: a cron's retention run happens between its uploads and its create.
    *hook.armed.lock().map_err(|e| e.to_string())? = Some((b.clone(), acme.clone(), policy));
    let res = z.ship(&mut za, test_snapshot(3)?).await;
    assert!(matches!(res, Err(Error::Fenced { .. })), "{res:?}");
    // Whatever landed in slot 3 must name objects that exist.
    let log = b.history(&acme).await?;
    for e in &log {
        if let Some(name) = e.blob() {
            let path = Path::from(format!("t/orgs/acme/snap/{name}"));
            assert!(
                raw.head(&path).await.is_ok(),
                "kept entry {} ({} of round {}) names {name}, which retention deleted",
                e.seq(),
                e.kind_name(),
                e.round()
            );
        }
    }
    let report = b.verify(&acme).await?;
    assert!(report.failed.is_empty(), "verify: {:?}", report.failed);
    Ok(())
}
