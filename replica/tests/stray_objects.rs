//! Regression: a stray file in an org's log folder (a `.DS_Store`, an editor's backup) made
//! every read of that org's history fail, so the org answered 500 until it was removed.

use std::sync::Arc;

use idem_replica::{Error, OrgId, Replica, Settings};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

#[tokio::test]
async fn stray_objects_in_the_log_folder_are_skipped() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Replica::local_store(dir.path())?;
    let replica = Replica::open(store.clone(), "", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let claim = replica.claim(&org, "w", false).await?;
    for stray in [".DS_Store", "00000000000000000001.json~", "notes.txt"] {
        store
            .put(&Path::from(format!("orgs/acme/log/{stray}")), "x".into())
            .await?;
    }
    let history = replica.history(&org).await?;
    assert_eq!(history.len(), 1, "only the claim is history");
    // The writer ships and a successor claims past the stray objects.
    let mut claim = claim;
    replica.release(&mut claim).await?;
    let next = replica.claim(&org, "w2", false).await?;
    assert_eq!(next.round(), 2);
    let missing: Result<_, Error> = replica.history(&OrgId::new("other")?).await;
    assert!(missing?.is_empty());
    Ok(())
}
