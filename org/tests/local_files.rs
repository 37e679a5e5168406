//! I8 and I12 for local files and org ids: the local file is a cache, never an authority;
//! orgs never touch each other's data.

mod common;

use std::sync::Arc;

use common::{R, effect, published, registry, replica};
use idem_org::{ErrorKind, RegistrySettings};
use object_store::memory::InMemory;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_or_ahead_local_files_are_replaced_by_hydrate() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(InMemory::new());
    let data = dir.path().join("data");
    let a = registry(
        &data,
        replica(store.clone(), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    a.acquire(&idem_replica::OrgId::new("acme")?)
        .await?
        .once("shipped", effect("acme", "shipped"))
        .await?;
    a.shutdown().await;

    // A dead claim's files, "ahead" of the store: a row that was never shipped.
    let org_dir = data.join("orgs").join("acme");
    let dead = org_dir.join("00000000000000000099-dead.db");
    {
        let c = rusqlite::Connection::open(&dead)?;
        c.execute_batch(common::LEDGER)?;
        c.execute("INSERT INTO effects VALUES ('unshipped', 'acme')", [])?;
    }
    std::fs::write(org_dir.join("00000000000000000099-dead.lock"), b"")?;
    // ... and the temp file of a hydrate it was killed in.
    let temp = org_dir.join(".00000000000000000099-dead.db.hydrate-0123abcd");
    std::fs::write(&temp, vec![0u8; 4096])?;

    let b = registry(
        &data,
        replica(store, None).await?,
        "B",
        RegistrySettings::default(),
    )?;
    let org = b.acquire(&idem_replica::OrgId::new("acme")?).await?;
    assert!(!dead.exists(), "a dead claim's database is removed");
    assert!(
        !temp.exists(),
        "a dead claim's hydrate temp file is removed"
    );
    let out = org.once("shipped", effect("acme", "again")).await?;
    assert!(!out.applied, "state comes from the store");
    let (effects, _) = published(b.replica(), "acme", dir.path()).await?;
    assert!(
        !effects.contains_key("unshipped"),
        "unshipped local state is discarded"
    );
    assert_eq!(idem_org::testing::open_claims(&data), 1);
    b.shutdown().await;
    assert_eq!(
        idem_org::testing::open_claims(&data),
        0,
        "release deletes the local files"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_org_ids_are_refused_and_orgs_are_isolated() -> R {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let reg = registry(
        &data,
        replica(Arc::new(InMemory::new()), None).await?,
        "A",
        RegistrySettings::default(),
    )?;
    let long = "a".repeat(1024);
    for bad in [
        "../x",
        "a/b",
        "",
        "..",
        "acme/../acme2",
        long.as_str(),
        "ünïcode",
        ".hidden",
    ] {
        // The edge validates an org id once; the registry only takes a validated one.
        let err = idem_replica::OrgId::new(bad)
            .err()
            .ok_or(format!("accepted {bad:?}"))?;
        assert_eq!(
            err.kind(),
            idem_replica::ErrorKind::Input,
            "{bad:?}: {err:?}"
        );
    }
    assert!(!dir.path().join("x").exists());
    let (acme_id, acme2_id) = (
        idem_replica::OrgId::new("acme")?,
        idem_replica::OrgId::new("acme2")?,
    );
    reg.once(&acme_id, "k", effect("acme", "k")).await?;
    let other = reg.once(&acme2_id, "k", effect("acme2", "k")).await?;
    assert!(
        other.applied,
        "the same key in another org is another request"
    );
    let (acme, _) = published(reg.replica(), "acme", dir.path()).await?;
    let (acme2, _) = published(reg.replica(), "acme2", dir.path()).await?;
    assert_eq!((acme.len(), acme2.len()), (1, 1));
    reg.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_orgs_with_a_low_open_limit_stay_bounded_and_correct() -> R {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let settings = RegistrySettings {
        max_open_orgs: 16,
        ..RegistrySettings::default()
    };
    let reg = registry(
        &data,
        replica(Arc::new(InMemory::new()), None).await?,
        "A",
        settings,
    )?;
    let orgs = 2_000;
    let mut peak = 0;
    for i in 0..orgs {
        let org = format!("org-{i:04}");
        let out = reg
            .once(&idem_replica::OrgId::new(&org)?, "k", effect(&org, "k"))
            .await?;
        assert!(out.applied);
        // Counting reads every org's directory, so it runs every 7th org (and the last): 7
        // is prime to the limit, so the counts fall at every phase of the evictions' cycle,
        // and a leaked claim stays to be counted.
        if i % 7 == 0 || i == orgs - 1 {
            peak = peak.max(idem_org::testing::open_claims(&data));
        }
    }
    assert!(peak <= 17, "local claims peaked at {peak}");
    assert!(reg.open_orgs().len() <= 16);
    // Re-acquiring an evicted org hydrates its state: a replay, not a second run.
    let out = reg
        .once(
            &idem_replica::OrgId::new("org-0000")?,
            "k",
            effect("org-0000", "k"),
        )
        .await?;
    assert!(!out.applied);
    assert_eq!(reg.replica().orgs().await?.len(), orgs);
    reg.shutdown().await;
    Ok(())
}

/// Regression: a writer that could not make its local files claimed first, writing a new
/// round (fencing the org's live writer) on every request it then failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_cannot_make_its_files_claims_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(InMemory::new());
    let data = dir.path().join("data");
    let replica = replica(store.clone(), None).await?;
    let reg = registry(&data, replica.clone(), "A", RegistrySettings::default())?;
    std::fs::create_dir_all(data.join("orgs"))?;
    std::fs::write(data.join("orgs").join("acme"), b"not a directory")?;
    for _ in 0..3 {
        let e = reg
            .acquire(&idem_replica::OrgId::new("acme")?)
            .await
            .err()
            .ok_or("acquired")?;
        assert_eq!(e.kind(), ErrorKind::Fatal, "{e}");
    }
    let history = replica.history(&idem_replica::OrgId::new("acme")?).await?;
    assert!(history.is_empty(), "claims written: {}", history.len());
    Ok(())
}
