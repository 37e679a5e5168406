//! Regression (I6, I7): a fenced writer that has not tried to ship yet must not answer
//! replays or reads from its local file. Replays and `applied` returned Ok as soon as the
//! key's commit was shipped, with no check that the writer still owned the org, so a zombie
//! reported a key its successor acknowledged as absent, and a writer fenced before its first
//! ship acknowledged replays.

mod common;

use std::sync::Arc;

use common::{R, effect, force, registry, replica};
use idem_org::{Error, RegistrySettings};
use object_store::memory::InMemory;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_writer_answers_no_read_or_replay() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(InMemory::new());
    let a = registry(
        &dir.path().join("a"),
        replica(store.clone(), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let org_a = a.acquire(&idem_replica::OrgId::new("acme")?).await?;
    org_a.once("k1", effect("acme", "k1")).await?;
    let b = registry(
        &dir.path().join("b"),
        replica(store.clone(), None).await?,
        "B",
        force(),
    )?;
    let org_b = b.acquire(&idem_replica::OrgId::new("acme")?).await?;
    assert!(org_b.once("k2", effect("acme", "k2")).await?.applied);

    let read = org_a
        .applied("k2")
        .await
        .err()
        .ok_or("zombie answered applied(k2)")?;
    assert!(matches!(read, Error::Fenced { .. }), "{read:?}");
    let replay = org_a
        .once("k1", effect("acme", "k1"))
        .await
        .err()
        .ok_or("zombie acked a replay")?;
    assert!(matches!(replay, Error::Fenced { .. }), "{replay:?}");
    assert!(!org_a.is_serving());
    // The live writer answers both, each after its own confirmation.
    assert!(org_b.applied("k2").await?.is_some_and(|r| r.is_applied()));
    assert!(!org_b.once("k1", effect("acme", "never")).await?.applied);
    b.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_fenced_before_its_first_ship_acks_no_replay() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(InMemory::new());
    let a = registry(
        &dir.path().join("a"),
        replica(store.clone(), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    a.acquire(&idem_replica::OrgId::new("acme")?)
        .await?
        .once("k1", effect("acme", "k1"))
        .await?;
    a.shutdown().await;
    let b = registry(
        &dir.path().join("b"),
        replica(store.clone(), None).await?,
        "B",
        RegistrySettings::default(),
    )?;
    let org_b = b.acquire(&idem_replica::OrgId::new("acme")?).await?;
    let c = registry(
        &dir.path().join("c"),
        replica(store, None).await?,
        "C",
        force(),
    )?;
    let org_c = c.acquire(&idem_replica::OrgId::new("acme")?).await?;
    let err = org_b
        .once("k1", effect("acme", "k1"))
        .await
        .err()
        .ok_or("fenced B acked a replay")?;
    assert!(matches!(err, Error::Fenced { .. }), "{err:?}");
    assert!(!org_c.once("k1", effect("acme", "k1")).await?.applied);
    c.shutdown().await;
    Ok(())
}
