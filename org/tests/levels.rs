//! The point-in-time window through the org layer (`docs/design.md` 2d): a full snapshot
//! closes a chain, the registry compacts it into a level file in the background, and a later
//! retention run deletes its deltas once they are older than `keep_ms`; every moment then
//! restores to its minute's last acknowledged state, with exactly the keys acknowledged by then.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::{R, effect};
use idem_org::{Registry, RegistrySettings};
use idem_replica::{Clock, OrgId, Replica, SystemClock};

const MINUTE: u64 = 60_000;

/// The keys a restored database holds.
fn keys(path: &std::path::Path) -> Result<BTreeSet<String>, common::BoxErr> {
    let conn = idem_org::rusqlite::Connection::open(path)?;
    let mut stmt = conn.prepare("SELECT key FROM effects")?;
    let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The closed chains that have a level file.
async fn level_files(replica: &Replica, org: &OrgId) -> Result<usize, common::BoxErr> {
    let sections = replica.level_positions(org).await?;
    Ok(sections
        .iter()
        .map(|s| s.snapshot)
        .collect::<BTreeSet<_>>()
        .len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_chains_compact_in_the_background_and_every_moment_restores_its_keys() -> R {
    let dir = tempfile::tempdir()?;
    // Three hours ago on the injected clock: the final retention runs at the real time, which
    // the store's clock (the local directory's mtimes) agrees with (I15).
    let clock = Arc::new(idem::ManualClock::new(
        SystemClock.now_ms() - 3 * 60 * MINUTE,
    ));
    let host: Arc<dyn idem::Clock> = clock.clone();
    let store = Replica::local_store(&dir.path().join("store"))?;
    let replica = Replica::open_with(
        store,
        "",
        idem_replica::Settings::default(),
        host.clone(),
        None,
    )
    .await?;
    let mut settings = RegistrySettings::default();
    settings.ship.snapshot_interval_ms = 10 * MINUTE;
    settings.retain_every_ships = 1;
    settings.retain_interval_ms = 0;
    settings.retention.keep_snapshots = 1;
    let registry = Registry::builder(dir.path().join("data"), replica.clone(), "w")
        .settings(settings)
        .on_open(|c| c.execute_batch(common::LEDGER))
        .clock(host)
        .build()?;
    let org = OrgId::new("acme")?;
    let handle = registry.acquire(&org).await?;
    // Each key's acknowledgement time on the injected clock (its ship's at_ms).
    let mut acked: Vec<(String, u64)> = Vec::new();
    let mut n = 0;
    let mut once = async |acked: &mut Vec<(String, u64)>| -> R {
        n += 1;
        let key = format!("k{n}");
        assert!(handle.once(&key, effect("acme", &key)).await?.applied);
        acked.push((key, clock.now_ms()));
        Ok(())
    };
    for chain in 0..3u64 {
        for i in 0..8u64 {
            clock.advance(20_000 + (i * 17 + chain * 29) % 50 * 1_000);
            once(&mut acked).await?;
        }
        // Past the interval: the next request ships a full snapshot, closing this chain,
        // and the registry compacts it on its own task: wait until its level file is there.
        clock.advance(10 * MINUTE);
        once(&mut acked).await?;
        let mut waited = Duration::ZERO;
        while level_files(&replica, &org).await? < chain as usize + 1 {
            assert!(waited < Duration::from_secs(30), "no level file after 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
            waited += Duration::from_millis(20);
        }
    }
    // An hour on (the real time now): one more full snapshot runs retention, which deletes
    // the closed chains' deltas.
    clock.advance(SystemClock.now_ms().saturating_sub(clock.now_ms()));
    once(&mut acked).await?;
    // Retention runs on the shipper's task after that ship's acknowledgement: wait for it.
    let mut waited = Duration::ZERO;
    let log = loop {
        let log = replica.history(&org).await?;
        if log.iter().filter(|e| e.is_delta()).count() == 0 {
            break log;
        }
        assert!(
            waited < Duration::from_secs(30),
            "closed chains not thinned: {log:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    };
    let tmp = tempfile::tempdir()?;
    let sections = replica.level_positions(&org).await?;
    assert!(sections.len() >= 3, "{sections:?}");
    for (i, (_, at)) in acked.iter().enumerate() {
        let seq = replica.position_at_time(&org, *at).await?;
        let dest = tmp.path().join(format!("at-{i}.db"));
        replica.restore(&org, Some(seq), &dest).await?;
        // The position is this moment's kept one: a section's or a snapshot's time.
        let at_ms = sections
            .iter()
            .find(|s| s.seq == seq)
            .map(|s| s.at_ms)
            .or_else(|| log.iter().find(|e| e.seq() == seq).map(|e| e.at_ms()))
            .ok_or_else(|| format!("position {seq} is neither a section nor in the log"))?;
        assert!(at_ms <= *at);
        let want: BTreeSet<String> = acked
            .iter()
            .filter(|(_, t)| *t <= at_ms)
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(keys(&dest)?, want, "moment {at}, position {seq}");
    }
    for (org, closed) in registry.shutdown().await {
        closed.map_err(|e| format!("{org}: {e}"))?;
    }
    Ok(())
}
