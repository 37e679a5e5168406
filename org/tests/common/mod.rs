//! Helpers shared by the org integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use idem_org::{Registry, RegistrySettings};
use idem_replica::{Failpoints, Replica};
use object_store::ObjectStore;

pub type BoxErr = Box<dyn std::error::Error + Send + Sync>;
pub type R = Result<(), BoxErr>;

pub const LEDGER: &str =
    "CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL, org TEXT NOT NULL);";

pub mod journal;
pub mod oracle;
pub mod outside;
pub mod parked;
pub mod remote;
pub mod scenarios;

/// Set in a child process: the test binary re-run by one of its own tests (`--exact` names
/// that test), which sees it first thing and plays the child's role instead of the parent's.
/// So no test exists only to be a child, and every test counted as passed ran.
pub const CHILD_ENV: &str = "IDEM_TEST_CHILD";

/// The child role this process plays, if it is one.
pub fn child_role() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// This test binary, re-run as the child of test `test` playing `role`.
pub fn child_command(test: &str, role: &str) -> std::io::Result<std::process::Command> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role);
    Ok(cmd)
}

pub async fn replica(
    store: Arc<dyn ObjectStore>,
    failpoints: Option<Arc<dyn Failpoints>>,
) -> Result<Replica, BoxErr> {
    replica_at(store, "t", failpoints).await
}

/// A replica under `prefix` (tests sharing one bucket use a prefix each).
pub async fn replica_at(
    store: Arc<dyn ObjectStore>,
    prefix: &str,
    failpoints: Option<Arc<dyn Failpoints>>,
) -> Result<Replica, BoxErr> {
    Ok(Replica::open_with(
        store,
        prefix,
        idem_replica::Settings::default(),
        Arc::new(idem_replica::SystemClock),
        failpoints,
    )
    .await?)
}

/// A replica under `t` whose process lease has a term of `lease_ms`.
pub async fn replica_with_lease(
    store: Arc<dyn ObjectStore>,
    lease_ms: u64,
) -> Result<Replica, BoxErr> {
    let settings = idem_replica::Settings {
        lease_ms,
        ..idem_replica::Settings::default()
    };
    Ok(Replica::open_with(
        store,
        "t",
        settings,
        Arc::new(idem_replica::SystemClock),
        None,
    )
    .await?)
}

/// A live process beside the one under test: a registry holding one org, so its process
/// lease is renewed every third of `lease_ms`. Its PUTs ([`Replica::store_requests`]) are the
/// witness that renewal periods passed, without a sleep standing in for them.
pub async fn witness(
    dir: &std::path::Path,
    store: Arc<dyn ObjectStore>,
    lease_ms: u64,
) -> Result<(Replica, Registry), BoxErr> {
    let rw = replica_with_lease(store, lease_ms).await?;
    let w = registry(dir, rw.clone(), "ww", RegistrySettings::default())?;
    w.once(
        &idem_replica::OrgId::new("witness")?,
        "k",
        effect("witness", "k"),
    )
    .await?;
    Ok((rw, w))
}

/// Waits until the witness `rw` has written `n` more PUTs: `n` of its renewals.
pub async fn witness_puts(rw: &Replica, n: u64) -> R {
    let from = rw.store_requests().put;
    until(|| rw.store_requests().put >= from + n).await
}

pub fn registry(
    data: &std::path::Path,
    replica: Replica,
    writer: &str,
    settings: RegistrySettings,
) -> Result<Registry, BoxErr> {
    Ok(Registry::builder(data, replica, writer)
        .settings(settings)
        .on_open(|c| c.execute_batch(LEDGER))
        .build()?)
}

pub fn force() -> RegistrySettings {
    RegistrySettings {
        force_claim: true,
        ..RegistrySettings::default()
    }
}

/// An apply that writes one effect row for `key` and returns `key` as the result.
pub fn effect(
    org: &str,
    key: &str,
) -> impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<Vec<u8>> + Clone + Send + 'static {
    let (org, key) = (org.to_owned(), key.to_owned());
    move |tx| {
        tx.execute(
            "INSERT INTO effects (key, org) VALUES (?1, ?2)",
            [&key, &org],
        )?;
        Ok(key.into_bytes())
    }
}

/// Restores the latest published snapshot of `org` and returns (effects per key, key rows).
pub async fn published(
    replica: &Replica,
    org: &str,
    dir: &std::path::Path,
) -> Result<(std::collections::BTreeMap<String, i64>, i64), BoxErr> {
    let dest = dir.join(format!("check-{org}-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&dest);
    replica
        .restore(&idem_replica::OrgId::new(org)?, None, &dest)
        .await?;
    let conn = rusqlite::Connection::open(&dest)?;
    let mut stmt = conn.prepare("SELECT key, count(*) FROM effects GROUP BY key")?;
    let effects = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
        .collect::<Result<_, _>>()?;
    let keys = conn.query_row(
        "SELECT count(*) FROM idem_keys WHERE applied = 1",
        [],
        |r| r.get(0),
    )?;
    Ok((effects, keys))
}

/// Polls `cond` until it holds, failing after 20 s. Waits for a state, never orders events.
pub async fn until(mut cond: impl FnMut() -> bool) -> R {
    let waited = idem_base::Stopwatch::start();
    while !cond() {
        if waited.elapsed() > std::time::Duration::from_secs(20) {
            return Err("condition not reached within 20 s".into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Entries of `/proc/self/<dir>`: this process's threads (`task`) or descriptors (`fd`).
pub fn proc_entries(dir: &str) -> std::io::Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/self/{dir}"))?.count())
}

/// A `kB` field of `/proc/self/status` (`VmRSS:`, `VmHWM:`), in KiB.
pub fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
