//! A journal tenure's local file is a cache of the process's lifetime (`docs/design.md` 3g,
//! "Local files of a journal tenure"): installed and written without a single fsync
//! (`synchronous = OFF`, page 1 already in WAL mode), never kept at release, never resumed.
//! The tests check the setting each writer runs with and the reason it is safe: whatever a
//! crash leaves of such a file, the next process on the host hydrates from the store and
//! deletes the leftover.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::journal::{LEASE_MS, in_store, keys, org, replays_within};
use common::{R, effect, registry, replica_with_lease};
use idem_org::{Registry, RegistrySettings};
use object_store::ObjectStore;
use object_store::memory::InMemory;

/// `PRAGMA synchronous` as the writer's own transaction sees it, returned as the result of
/// an acknowledged request (0 = OFF, 1 = NORMAL, 2 = FULL).
async fn synchronous(
    reg: &Registry,
    org: &idem_replica::OrgId,
    key: &str,
) -> Result<u8, common::BoxErr> {
    let out = reg
        .once(org, key, |tx| {
            let mode: i64 = tx.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
            Ok::<_, rusqlite::Error>(vec![u8::try_from(mode).unwrap_or(u8::MAX)])
        })
        .await?;
    assert!(out.applied);
    Ok(out.result[0])
}

/// The database files (`*.db`) in `data`'s directory of `org`.
fn db_files(data: &Path, org: &str) -> Vec<PathBuf> {
    let dir = data.join("orgs").join(org);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "db"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_writer_never_fsyncs_and_a_per_org_writer_syncs_at_checkpoints() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let replica = replica_with_lease(store.clone(), LEASE_MS).await?;
    let journal = registry(
        &dir.path().join("j"),
        replica.clone(),
        "wj",
        common::journal::settings(64 << 10),
    )?;
    let per_org = registry(
        &dir.path().join("p"),
        replica,
        "wp",
        RegistrySettings::default(),
    )?;
    // A never-written org (SQLite creates the file) and one installed from the store
    // (a successor's hydrate after a graceful release) both run with OFF.
    assert_eq!(synchronous(&journal, &org(0), "s0").await?, 0);
    assert_eq!(synchronous(&per_org, &org(1), "s0").await?, 1);
    journal.shutdown().await;
    let replica = replica_with_lease(store, LEASE_MS).await?;
    let successor = registry(
        &dir.path().join("j2"),
        replica,
        "wj2",
        common::journal::settings(64 << 10),
    )?;
    assert_eq!(synchronous(&successor, &org(0), "s1").await?, 0);
    successor.shutdown().await;
    per_org.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_file_a_crash_left_is_never_served_and_is_deleted() -> R {
    const ROUNDS: usize = 4;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let a = registry(&data, ra.clone(), "wa", common::journal::settings(64 << 10))?;
    let o = org(0);
    for k in keys(ROUNDS) {
        assert!(a.once(&o, &k, effect("org0", &k)).await?.applied);
    }
    // A host crash: no release, no seal, and what the OS had not written of the file is
    // lost. Here: the database file is garbage and the WAL is gone.
    drop(a);
    drop(ra);
    let left = db_files(&data, "org0");
    assert_eq!(left.len(), 1, "{left:?}");
    let len = std::fs::metadata(&left[0])?.len().max(4096);
    std::fs::write(&left[0], vec![0xA5; usize::try_from(len)?])?;
    let mut wal = left[0].clone().into_os_string();
    wal.push("-wal");
    let _ = std::fs::remove_file(&wal);
    // The process restarts on the same data directory.
    let rb = replica_with_lease(store, LEASE_MS).await?;
    let b = registry(&data, rb.clone(), "wb", common::journal::settings(64 << 10))?;
    // Every acknowledged key replays with its first result (once A's lease lapses).
    replays_within(std::time::Duration::from_secs(15), &b, &o, &keys(ROUNDS)).await?;
    assert!(!left[0].exists(), "the torn file is still there");
    b.shutdown().await;
    let effects = in_store(&rb, dir.path(), &o, &keys(ROUNDS), &[]).await?;
    assert_eq!(effects.len(), ROUNDS, "{effects:?}");
    Ok(())
}

/// Damages every database file in `data`'s directory of an org the first time an acquire
/// installed its state there (`FailPoint::JournalInstalled` on the journal,
/// `FailPoint::HydrateInstalled` per org; before the writer opens it): page 2's b-tree
/// header is overwritten, which `quick_check` finds.
#[derive(Debug)]
struct DamageOnce {
    data: PathBuf,
    armed: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl idem_replica::Failpoints for DamageOnce {
    async fn hit(
        &self,
        point: idem_replica::FailPoint,
        org: &idem_replica::OrgId,
    ) -> Result<(), String> {
        use idem_replica::FailPoint::{HydrateInstalled, JournalInstalled};
        use std::os::unix::fs::FileExt;
        if !matches!(point, JournalInstalled | HydrateInstalled)
            || !self.armed.swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(());
        }
        for db in db_files(&self.data, org.as_str()) {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&db)
                .map_err(|e| e.to_string())?;
            file.write_all_at(&[0xff; 8], 4096)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// A volatile install is checked by the writer's own connection (`sqlite::open_installed`)
/// before anything serves or writes it: a file damaged between the install and the open is
/// a typed `Corrupt` error, its files are removed and nothing is answered; the next request
/// acquires again and replays every acknowledged key from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_damaged_before_the_writer_opens_it_is_never_served() -> R {
    damaged_install_is_never_served(common::journal::settings(64 << 10)).await
}

/// The same for a per-org tenure's synced install (`Replica::hydrate_for_writer`): its
/// `quick_check` is the writer's first access too, and a file that fails it is removed, so
/// it is never served nor kept for a later resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_org_install_damaged_before_the_writer_opens_it_is_never_served() -> R {
    damaged_install_is_never_served(RegistrySettings::default()).await
}

async fn damaged_install_is_never_served(settings: RegistrySettings) -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let ra = replica_with_lease(store.clone(), LEASE_MS).await?;
    let a = registry(&dir.path().join("a"), ra, "wa", settings.clone())?;
    let o = org(0);
    let acked = keys(3);
    for k in &acked {
        assert!(a.once(&o, k, effect(o.as_str(), k)).await?.applied);
    }
    let results = a.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");

    let data = dir.path().join("b");
    let damage = Arc::new(DamageOnce {
        data: data.clone(),
        armed: std::sync::atomic::AtomicBool::new(true),
    });
    let rb = idem_replica::Replica::open_with(
        store.clone(),
        "t",
        idem_replica::Settings {
            lease_ms: LEASE_MS,
            ..idem_replica::Settings::default()
        },
        Arc::new(idem_replica::SystemClock),
        Some(damage.clone()),
    )
    .await?;
    let b = registry(&data, rb.clone(), "wb", settings)?;
    let err = b
        .once(&o, &acked[0], effect(o.as_str(), "ran-again"))
        .await
        .expect_err("a damaged install must not be served");
    assert_eq!(err.kind(), idem_org::ErrorKind::Corrupt, "{err:?}");
    assert!(
        !damage.armed.load(std::sync::atomic::Ordering::SeqCst),
        "the failpoint never fired"
    );
    assert!(
        db_files(&data, o.as_str()).is_empty(),
        "the damaged file was left: {:?}",
        db_files(&data, o.as_str())
    );
    // Undamaged, the next acquire serves the store's state.
    replays_within(std::time::Duration::from_secs(10), &b, &o, &acked).await?;
    assert!(
        b.once(&o, "after", effect(o.as_str(), "after"))
            .await?
            .applied
    );
    let results = b.shutdown().await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    let mut all = acked.clone();
    all.push("after".into());
    in_store(&rb, dir.path(), &o, &all, &["ran-again"]).await?;
    Ok(())
}
