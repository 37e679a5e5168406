//! `Registry::read`, the read that never claims: a tenant never written reads as empty and
//! leaves nothing in the store (no claim, no lease, no log); an org another process holds is
//! read from the store's newest published state without fencing it; the holder reads through
//! its writer.

use std::path::Path;
use std::sync::Arc;

use futures::TryStreamExt;
use idem_org::replica::{OrgId, Replica, Settings};
use idem_org::{ReadSource, Registry, rusqlite};
use object_store::ObjectStore;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn registry(replica: Replica, data: &Path, writer: &str) -> Result<Registry, idem_org::Error> {
    Registry::builder(data, replica, writer)
        .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS notes (text TEXT)"))
        .build()
}

fn count(c: &rusqlite::Connection) -> rusqlite::Result<i64> {
    c.query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
}

/// Every object in the store, by name.
async fn objects(store: &Arc<dyn ObjectStore>) -> Result<Vec<String>, object_store::Error> {
    let mut names: Vec<String> = store
        .list(None)
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await?;
    names.sort();
    Ok(names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_a_tenant_never_written_creates_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let replica = Replica::open(store.clone(), "prod", Settings::default()).await?;
    let reg = registry(replica, &dir.path().join("data"), "a")?;
    let ghost = OrgId::new("ghost")?;

    let read = reg.read(&ghost, count).await?;
    assert_eq!((read.value, read.source), (0, ReadSource::Empty));
    assert_eq!(objects(&store).await?, Vec::<String>::new());
    assert!(reg.serving(&ghost).is_none(), "a read opened the org");
    assert!(!dir.path().join("data/orgs/ghost").exists());
    // Nothing left of the temp folder either.
    let reads = dir.path().join("data/reads");
    assert_eq!(std::fs::read_dir(&reads)?.count(), 0, "temp folders stay");

    // A read that fails is the read's error, and still creates nothing.
    let err = reg
        .read(&ghost, |c| {
            c.query_row("SELECT x FROM missing", [], |r| r.get::<_, i64>(0))
        })
        .await
        .err()
        .ok_or("a failing read succeeded")?;
    assert!(matches!(err, idem_org::Error::Read { .. }), "{err}");
    assert_eq!(objects(&store).await?, Vec::<String>::new());

    // What a read through `acquire` + `Org::read` costs instead: a claim in the org's log and
    // this process's lease (acquire is for writing).
    let org = reg.acquire(&ghost).await?;
    assert_eq!(org.read(count).await?, 0);
    let written = objects(&store).await?;
    assert!(
        written
            .iter()
            .any(|o| o.starts_with("prod/orgs/ghost/log/"))
            && written.iter().any(|o| o.starts_with("prod/processes/")),
        "{written:?}"
    );
    reg.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_reads_the_published_state_without_fencing_the_holder() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let open = || Replica::open(store.clone(), "prod", Settings::default());
    let holder = registry(open().await?, &dir.path().join("a"), "a")?;
    let reader = registry(open().await?, &dir.path().join("b"), "b")?;
    let acme = OrgId::new("acme")?;
    for k in ["k-1", "k-2"] {
        holder
            .once(&acme, k, |tx| {
                tx.execute("INSERT INTO notes VALUES ('x')", [])?;
                Ok::<_, rusqlite::Error>(Vec::new())
            })
            .await?;
    }
    let before = objects(&store).await?;

    let read = reader.read(&acme, count).await?;
    assert_eq!(read.value, 2);
    let ReadSource::Store { seq, commit } = read.source else {
        return Err(format!("read from {:?}, not the store", read.source).into());
    };
    assert!(seq >= 1 && commit >= 2, "seq {seq} commit {commit}");
    assert_eq!(
        objects(&store).await?,
        before,
        "the read wrote to the store"
    );
    assert!(reader.serving(&acme).is_none());

    // The holder was not fenced: it keeps acknowledging, and reads through its writer.
    holder
        .once(&acme, "k-3", |tx| {
            tx.execute("INSERT INTO notes VALUES ('x')", [])?;
            Ok::<_, rusqlite::Error>(Vec::new())
        })
        .await?;
    let mine = holder.read(&acme, count).await?;
    assert_eq!(mine.value, 3);
    assert!(
        matches!(mine.source, ReadSource::Writer { .. }),
        "{:?}",
        mine.source
    );
    // And the reader sees the newer published state on its next read.
    assert_eq!(reader.read(&acme, count).await?.value, 3);
    holder.shutdown().await;
    reader.shutdown().await;
    Ok(())
}
