//! Another process on the host touching a served org's files (I13). The outsider is a Python
//! process with its own SQLite library (`common::outside`), or `cp`/`rm`/`mv`; the writer is
//! this process. After each fault: every acknowledged key is in the newest published state
//! exactly once, that state passes `integrity_check`, every chain verifies, a successor
//! replays every acknowledged key, and no request was acknowledged from the fault until the
//! org re-opened from the store.
//!
//! Regression: the shipper used to read the database and WAL through descriptors it closed,
//! which drops SQLite's POSIX locks for the whole process; an outside `sqlite3` reader then
//! checkpointed and deleted the WAL on close and acknowledged commits vanished from the store.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::outside::{all_locked, outside};
use common::{BoxErr, R, effect, registry, replica};
use idem::Options;
use idem_org::{Error, Registry, RegistrySettings};
use idem_replica::Replica;

fn wal_of(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}

struct World {
    dir: tempfile::TempDir,
    replica: Replica,
    reg: Registry,
}

async fn world() -> Result<World, BoxErr> {
    world_with(RegistrySettings::default()).await
}

async fn world_with(settings: RegistrySettings) -> Result<World, BoxErr> {
    let dir = tempfile::tempdir()?;
    let store = Replica::local_store(&dir.path().join("store"))?;
    let replica = replica(store, None).await?;
    let reg = registry(&dir.path().join("data"), replica.clone(), "w", settings)?;
    Ok(World { dir, replica, reg })
}

/// An acknowledgement: the key and the round whose ship acknowledged it.
type Ack = (String, u64);

/// `clients` tasks each send `per_client` new keys (`<prefix>-<c>-<i>`), retrying a key on
/// retryable and re-acquire errors; returns the acks and every error seen.
async fn load(
    reg: &Registry,
    prefix: &str,
    clients: usize,
    per_client: usize,
) -> Result<(Vec<Ack>, Vec<Error>), BoxErr> {
    let mut tasks = Vec::new();
    let acme = idem_replica::OrgId::new("acme")?;
    for c in 0..clients {
        let (reg, prefix, acme) = (reg.clone(), prefix.to_owned(), acme.clone());
        tasks.push(tokio::spawn(async move {
            let (mut acks, mut errors) = (Vec::new(), Vec::new());
            for i in 0..per_client {
                let key = format!("{prefix}-{c}-{i}");
                for _ in 0..20 {
                    let org = match reg.acquire(&acme).await {
                        Ok(o) => o,
                        Err(e) => {
                            errors.push(e);
                            continue;
                        }
                    };
                    match org
                        .once_with(&key, Options::new(), effect("acme", &key))
                        .await
                    {
                        Ok(out) => {
                            acks.push((key.clone(), org.round()));
                            assert_eq!(out.result, key.as_bytes());
                            break;
                        }
                        Err(e) => errors.push(e),
                    }
                }
            }
            (acks, errors)
        }));
    }
    let (mut acks, mut errors) = (Vec::new(), Vec::new());
    for t in tasks {
        let (a, e) = t.await?;
        acks.extend(a);
        errors.extend(e);
    }
    if acks.len() != clients * per_client {
        return Err(format!(
            "{} of {} keys acknowledged: {errors:?}",
            acks.len(),
            clients * per_client
        )
        .into());
    }
    Ok((acks, errors))
}

/// Shuts the writer down, then checks the store against every acknowledgement: the shared
/// exactly-once oracle, with the outsider's row forbidden.
async fn check_store(w: World, acked: &[Ack]) -> R {
    w.reg.shutdown().await;
    let keys: Vec<String> = acked.iter().map(|(k, _)| k.clone()).collect();
    common::oracle::exactly_once(&w.replica, "acme", &keys, &["outsider"], w.dir.path()).await
}

/// The control: the outsider does reach a database nobody owns, so the refusals below are
/// the writer's lock at work, not an outsider that cannot open files.
#[test]
fn the_outsider_reads_writes_and_checkpoints_a_database_nobody_owns() -> R {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("free.db");
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL; {}; CREATE TABLE idem_keys (key TEXT);",
        common::LEDGER
    ))?;
    drop(conn);
    for (action, want) in [("read", "ok 0"), ("write", "ok 1"), ("TRUNCATE", "ok 0")] {
        let lines = outside(action, &db, 1)?;
        assert_eq!(lines, [want], "{action}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_reader_is_refused_and_loses_nothing() -> R {
    let w = world().await?;
    let (mut acked, _) = load(&w.reg, "a", 4, 10).await?;
    let db = common::outside::served_db(&w.dir.path().join("data"))?;
    // One read that opens and closes between two loads, then readers during a load.
    all_locked("read", &outside("read", &db, 1)?)?;
    acked.extend(load(&w.reg, "b", 4, 10).await?.0);
    let reader = {
        let db = db.clone();
        tokio::task::spawn_blocking(move || outside("read", &db, 40).map_err(|e| e.to_string()))
    };
    acked.extend(load(&w.reg, "c", 8, 15).await?.0);
    all_locked("read", &reader.await??)?;
    acked.extend(load(&w.reg, "d", 4, 10).await?.0);
    let round = w
        .reg
        .acquire(&idem_replica::OrgId::new("acme")?)
        .await?
        .round();
    assert!(
        acked.iter().all(|(_, r)| *r == round),
        "nothing re-opened the org"
    );
    check_store(w, &acked).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_checkpoint_in_every_mode_is_refused() -> R {
    let w = world().await?;
    let mut acked = load(&w.reg, "a", 4, 10).await?.0;
    let db = common::outside::served_db(&w.dir.path().join("data"))?;
    for mode in ["PASSIVE", "FULL", "RESTART", "TRUNCATE"] {
        all_locked(mode, &outside(mode, &db, 1)?)?;
        let looping = {
            let db = db.clone();
            tokio::task::spawn_blocking(move || outside(mode, &db, 20).map_err(|e| e.to_string()))
        };
        acked.extend(load(&w.reg, mode, 8, 8).await?.0);
        all_locked(mode, &looping.await??)?;
    }
    check_store(w, &acked).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outside_write_or_backup_is_refused_and_changes_nothing() -> R {
    let w = world().await?;
    let mut acked = load(&w.reg, "a", 4, 10).await?.0;
    let db = common::outside::served_db(&w.dir.path().join("data"))?;
    all_locked("write", &outside("write", &db, 3)?)?;
    all_locked("backup", &outside("backup", &db, 1)?)?;
    acked.extend(load(&w.reg, "b", 4, 10).await?.0);
    let org = w.reg.acquire(&idem_replica::OrgId::new("acme")?).await?;
    let outsiders: i64 = org
        .read(|c| {
            c.query_row(
                "SELECT count(*) FROM effects WHERE key = 'outsider'",
                [],
                |r| r.get(0),
            )
        })
        .await?;
    assert_eq!(outsiders, 0);
    check_store(w, &acked).await
}

/// Loads, runs `prepare` on the served database's path, loads again (with checkpoints every
/// few KiB of WAL, so the database file moves on), applies `fault`, loads again: the first
/// ship after the fault poisons the org (nothing acknowledged under the old round), and the
/// org re-opens from the store under a new round.
async fn poisoned_by(prepare: impl FnOnce(&Path) -> R, fault: impl FnOnce(&Path) -> R) -> R {
    let w = world_with(RegistrySettings {
        ship: idem_replica::ShipPolicy {
            wal_checkpoint_bytes: 16 << 10,
            ..idem_replica::ShipPolicy::default()
        },
        ..RegistrySettings::default()
    })
    .await?;
    let mut acked = load(&w.reg, "a", 4, 10).await?.0;
    let db = common::outside::served_db(&w.dir.path().join("data"))?;
    prepare(&db)?;
    acked.extend(load(&w.reg, "a2", 4, 10).await?.0);
    let before = w
        .reg
        .acquire(&idem_replica::OrgId::new("acme")?)
        .await?
        .round();
    fault(&db)?;
    let (after, errors) = load(&w.reg, "b", 4, 10).await?;
    assert!(
        errors.iter().any(|e| matches!(e, Error::Poisoned { .. })),
        "the fault must poison the org: {errors:?}"
    );
    for (key, round) in &after {
        assert!(
            *round > before,
            "{key} was acknowledged by the writer whose files changed"
        );
    }
    acked.extend(after);
    check_store(w, &acked).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlinked_wal_poisons_the_org() -> R {
    poisoned_by(|_| Ok(()), |db| Ok(std::fs::remove_file(wal_of(db))?)).await
}

fn run(cmd: &mut Command) -> R {
    let status = cmd.status()?;
    if !status.success() {
        return Err(format!("{cmd:?}: {status}").into());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_overwritten_by_an_older_copy_poisons_the_org() -> R {
    // `cp` from another process: an older copy written back in place, over the inode the
    // writer has open.
    poisoned_by(
        |db| run(Command::new("cp").arg(db).arg(db.with_extension("old"))),
        |db| run(Command::new("cp").arg(db.with_extension("old")).arg(db)),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_renamed_over_poisons_the_org() -> R {
    poisoned_by(
        |db| run(Command::new("cp").arg(db).arg(db.with_extension("old"))),
        |db| Ok(std::fs::rename(db.with_extension("old"), db)?),
    )
    .await
}

/// Regression (I13): an answer that ships nothing (a replay, a read) was confirmed without
/// looking at the files, so a database overwritten in place could answer from the old copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_the_database_was_overwritten_poisons_the_org() -> R {
    let w = world_with(RegistrySettings {
        ship: idem_replica::ShipPolicy {
            wal_checkpoint_bytes: 16 << 10,
            ..idem_replica::ShipPolicy::default()
        },
        ..RegistrySettings::default()
    })
    .await?;
    let acked = load(&w.reg, "a", 4, 10).await?.0;
    let db = common::outside::served_db(&w.dir.path().join("data"))?;
    let old = db.with_extension("old");
    run(Command::new("cp").arg(&db).arg(&old))?;
    let more = load(&w.reg, "b", 4, 10).await?.0;
    run(Command::new("cp").arg(&old).arg(&db))?;
    let org = w.reg.acquire(&idem_replica::OrgId::new("acme")?).await?;
    let got = org.applied("b-0-0").await;
    assert!(matches!(got, Err(Error::Poisoned { .. })), "{got:?}");
    let mut all = acked;
    all.extend(more);
    check_store(w, &all).await
}
