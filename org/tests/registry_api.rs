//! The registry's request API: a validated org id in, the same calls as an acquired handle,
//! and a hydrated state whose commit sequence disagrees with its entry never served.

mod common;

use std::sync::Arc;

use common::{R, effect, registry, replica};
use idem::effect;
use idem_org::{ErrorKind, RegistrySettings};
use idem_replica::{OrgId, Snapshot};
use object_store::memory::InMemory;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_once_with_and_effect_through_the_registry_replay_after_a_release() -> R {
    let dir = tempfile::tempdir()?;
    let reg = registry(
        dir.path(),
        replica(Arc::new(InMemory::new()), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let acme = OrgId::new("acme")?;
    assert!(reg.once(&acme, "k1", effect("acme", "k1")).await?.applied);
    let opts = idem::Options::new().fingerprint(b"body".to_vec());
    assert!(
        reg.once_with(&acme, "k2", opts.clone(), effect("acme", "k2"))
            .await?
            .applied
    );
    let sent = reg
        .effect(&acme, "mail", effect::Options::new(), || async {
            Ok(b"sent".to_vec())
        })
        .await?;
    assert!(sent.executed);

    // The handle closes; the registry acquires again (the next round hydrates) and every
    // call replays instead of running again.
    reg.serving(&acme)
        .ok_or("acme is served")?
        .release()
        .await?;
    assert!(reg.serving(&acme).is_none());
    assert!(
        !reg.once(&acme, "k1", effect("acme", "again"))
            .await?
            .applied
    );
    let err = reg
        .once_with(
            &acme,
            "k2",
            idem::Options::new().fingerprint(b"other".to_vec()),
            effect("acme", "again"),
        )
        .await
        .err()
        .ok_or("a changed payload under k2 was accepted")?;
    assert!(err.is_fingerprint_mismatch(), "{err}");
    assert_eq!(err.kind(), ErrorKind::Rejected);
    let replay = reg
        .effect(&acme, "mail", effect::Options::new(), || async {
            Ok(b"sent twice".to_vec())
        })
        .await?;
    assert!(!replay.executed);
    assert_eq!(replay.result, b"sent");
    reg.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hydrated_file_whose_commit_sequence_differs_from_its_entry_is_not_served() -> R {
    let dir = tempfile::tempdir()?;
    let replica = replica(Arc::new(InMemory::new()), None).await?;
    let acme = OrgId::new("acme")?;
    // A writer publishes a database holding commit 5 under an entry that says 7.
    let mut claim = replica.claim(&acme, "liar", false).await?;
    let conn = rusqlite::Connection::open_in_memory()?;
    conn.execute_batch(
        "CREATE TABLE idem_org_commit (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL);
         INSERT INTO idem_org_commit VALUES (0, 5);",
    )?;
    replica
        .ship(&mut claim, Snapshot::take(&conn, |_| Ok(7))?)
        .await?;
    replica.release(&mut claim).await?;

    let reg = registry(dir.path(), replica, "A", RegistrySettings::default())?;
    let err = reg
        .acquire(&acme)
        .await
        .err()
        .ok_or("a file disagreeing with its entry was served")?;
    assert!(
        matches!(
            err,
            idem_org::Error::CommitMismatch {
                hydrated: 7,
                in_file: 5,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert_eq!(
        idem_org::testing::open_claims(dir.path()),
        0,
        "the refused file was removed"
    );
    Ok(())
}
