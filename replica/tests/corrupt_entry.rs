//! Regression (I10): a log entry whose size field is corrupt is a typed error. Guards against
//! a size used to preallocate the decompression buffer, where a bit-flipped size aborted the
//! whole process (allocation failure), taking every tenant down.

use std::sync::Arc;

use idem_replica::{ErrorKind, OrgId, Replica, Settings, Snapshot};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload, memory::InMemory};

#[tokio::test]
async fn a_huge_size_in_a_snapshot_entry_is_corrupt_not_an_abort()
-> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(InMemory::new());
    let replica = Replica::open(store.clone(), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "w", false).await?;
    let conn = rusqlite::Connection::open_in_memory()?;
    conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")?;
    let shipped = replica
        .ship(&mut claim, Snapshot::take(&conn, |_| Ok(1))?)
        .await?;
    let path = Path::from(format!("orgs/acme/log/{:020}.json", shipped.seq));
    let text = String::from_utf8(store.get(&path).await?.bytes().await?.to_vec())?;
    let flipped = text.replacen(
        &format!("\"bytes\":{}", shipped.bytes),
        "\"bytes\":90000000000000",
        1,
    );
    assert_ne!(text, flipped, "the entry format changed: {text}");
    store
        .put(&path, PutPayload::from(flipped.into_bytes()))
        .await?;
    let dest = tempfile::tempdir()?;
    let err = replica
        .restore(&org, None, &dest.path().join("x.db"))
        .await
        .err()
        .ok_or("a corrupt entry was restored")?;
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err:?}");
    assert!(!dest.path().join("x.db").exists());
    Ok(())
}
