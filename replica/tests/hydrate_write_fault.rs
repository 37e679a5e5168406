//! When writing the image fails (disk full), a restore stops downloading and
//! reports the write's error; it does not go on fetching every remaining segment of the
//! snapshot first. Needs a small file system: it mounts a 256 KiB tmpfs, which takes root, so
//! it is `#[ignore]`d and fails where it cannot mount; CI runs it (`--include-ignored`, as
//! root).

use std::process::Command;
use std::sync::Arc;

use idem_replica::{Error, OrgId, Replica, Settings};
use object_store::memory::InMemory;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A 256 KiB tmpfs at a fresh directory, unmounted on drop.
struct Small(tempfile::TempDir);

impl Drop for Small {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: mounts a 256 KiB tmpfs"]
async fn a_failing_local_write_stops_the_segment_downloads() -> R {
    let dir = tempfile::tempdir()?;
    let small = Small(tempfile::tempdir()?);
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(small.0.path())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        return Err("cannot mount a tmpfs here: run this test as root".into());
    }
    let src = dir.path().join("tenant.db");
    rusqlite::Connection::open(&src)?.execute_batch(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, b BLOB);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4000)
         INSERT INTO t SELECT i, randomblob(1000) FROM n;",
    )?;
    let settings = Settings {
        // Above the image's held-write size: each segment goes to the file as it arrives.
        segment_bytes: 128 << 10,
        read_concurrency: 4,
        ..Settings::default()
    };
    let r = Replica::open(Arc::new(InMemory::new()), "t", settings).await?;
    let org = OrgId::new("acme")?;
    let mut claim = r.claim(&org, "w", false).await?;
    let shipped = r.ship_file(&mut claim, &src, 1).await?;
    let segments = shipped.bytes / (128 << 10);
    assert!(segments > 25, "{segments}");
    let before = r.store_requests();
    let got = r.restore(&org, None, &small.0.path().join("out.db")).await;
    let gets = r.store_requests().since(&before).get;
    assert!(matches!(got, Err(Error::Io { .. })), "{got:?}");
    assert!(
        gets < 16,
        "{gets} GETs for a restore whose image could not be written past 256 KiB \
         ({segments} segments)"
    );
    assert_eq!(
        std::fs::read_dir(small.0.path())?.count(),
        0,
        "a temp file was left"
    );
    Ok(())
}
