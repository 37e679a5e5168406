//! A panic in one request's `apply` rolls that request back and leaves the org's writer
//! serving the others (the writer thread catches it; docs/design.md, section 3).

mod common;

use std::sync::Arc;

use common::{R, effect, published, registry, replica};
use idem_org::{ErrorKind, RegistrySettings};
use object_store::memory::InMemory;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_apply_fails_that_request_only() -> R {
    let dir = tempfile::tempdir()?;
    let reg = registry(
        dir.path(),
        replica(Arc::new(InMemory::new()), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let org = reg.acquire(&idem_replica::OrgId::new("acme")?).await?;
    let err = org
        .once("boom", |tx| -> rusqlite::Result<Vec<u8>> {
            tx.execute("INSERT INTO effects VALUES ('boom', 'acme')", [])?;
            panic!("bug in apply")
        })
        .await
        .err()
        .ok_or("a panicking apply was acknowledged")?;
    assert_eq!(err.kind(), ErrorKind::Rejected, "{err:?}");
    assert!(org.is_serving(), "the writer survived the panic");
    assert!(org.once("k", effect("acme", "k")).await?.applied);
    let (effects, keys) = published(reg.replica(), "acme", dir.path()).await?;
    assert!(
        !effects.contains_key("boom"),
        "the panicked request's write was rolled back"
    );
    assert_eq!((effects.get("k"), keys), (Some(&1), 1));
    reg.shutdown().await;
    Ok(())
}
