//! Many snapshots streaming out and in at once on a small blocking pool, over the local
//! directory store (whose own I/O runs on that pool): every one completes. A segment reader
//! or writer that held a pool thread while waiting for uploads or downloads deadlocked here
//! once the streams outnumbered the pool's threads (found by `idem-bench --quick`'s rolling
//! upgrade). The timeout only bounds a hang: it orders nothing.

use std::time::Duration;

use idem_replica::{OrgId, Replica, Settings};

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const ORGS: usize = 8;

async fn run(dir: &std::path::Path) -> R {
    let store = Replica::local_store(&dir.join("store"))?;
    let settings = Settings {
        // 8 KiB segments over a few hundred KiB: dozens of segments per snapshot.
        segment_bytes: 8 << 10,
        ..Settings::default()
    };
    let replica = Replica::open(store, "t", settings).await?;
    let src = dir.join("tenant.db");
    rusqlite::Connection::open(&src)?.execute_batch(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, b BLOB);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400)
         INSERT INTO t SELECT i, randomblob(1000) FROM n;",
    )?;
    let mut ships = Vec::new();
    for i in 0..ORGS {
        let (r, src) = (replica.clone(), src.clone());
        ships.push(tokio::spawn(async move {
            let org = OrgId::new(&format!("org-{i}"))?;
            let mut claim = r.claim(&org, "w", false).await?;
            r.ship_file(&mut claim, &src, 1).await?;
            r.release(&mut claim).await?;
            Ok::<_, idem_replica::Error>(())
        }));
    }
    for s in ships {
        s.await??;
    }
    let mut hydrates = Vec::new();
    for i in 0..ORGS {
        let (r, dest) = (replica.clone(), dir.join(format!("org-{i}.db")));
        hydrates.push(tokio::spawn(async move {
            let org = OrgId::new(&format!("org-{i}"))?;
            let mut claim = r.claim(&org, "w2", false).await?;
            r.hydrate(&mut claim, &dest).await?;
            Ok::<_, idem_replica::Error>(())
        }));
    }
    for h in hydrates {
        h.await??;
    }
    let want = std::fs::read(&src)?;
    for i in 0..ORGS {
        let got = std::fs::read(dir.join(format!("org-{i}.db")))?;
        // Page 1's journal-mode bytes are normalised in shipped images.
        assert_eq!(got.len(), want.len());
        assert!(got[100..] == want[100..], "org-{i} hydrated other bytes");
    }
    Ok(())
}

#[test]
fn streams_outnumbering_the_blocking_pool_all_complete() -> R {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), run(dir.path()))
            .await
            .map_err(|_| "a stream hung on the blocking pool")?
    })
}
