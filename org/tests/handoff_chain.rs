//! Handoffs and re-acquires without re-shipping the database (I8, I10, I14): a successor
//! continues the chain it hydrated with deltas, a chain crossing rounds restores byte for
//! byte at every position, and a host re-acquiring an org it released reuses its file only
//! when the store proves it current.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{BoxErr, R, effect, registry, replica};
use idem_org::{Org, Registry, RegistrySettings};
use idem_replica::fault::{Fault, FaultStore, Op};
use idem_replica::{LogEntry, OrgId, Replica};
use object_store::ObjectStore;
use object_store::memory::InMemory;

/// The writer's database, page 1 in canonical (rollback) form as images are.
async fn image(org: &Org) -> Result<Vec<u8>, BoxErr> {
    let mut img = org.image().await?;
    img[18] = 1;
    img[19] = 1;
    Ok(img)
}

/// The same database, but for page 1's change counter (bytes 24–27) and the counter it is
/// valid for (92–95): SQLite bumps them in the file when a hydrated file (rollback mode)
/// switches to WAL, so two writers' images of one state differ there. A restore is compared
/// byte for byte instead: the successor's first delta carries that page 1.
fn same_state(a: &[u8], b: &[u8]) -> bool {
    let mask = |img: &[u8]| {
        let mut img = img.to_vec();
        for i in (24..28).chain(92..96) {
            if let Some(b) = img.get_mut(i) {
                *b = 0;
            }
        }
        img
    };
    mask(a) == mask(b)
}

/// One request inserting `rows` rows of about 1 KB.
async fn bulk(org: &Org, key: &str, rows: u32) -> R {
    org.once(key, move |tx| {
        tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < ?1) \
             INSERT INTO effects (key, org) SELECT 'bulk', hex(randomblob(512)) FROM n",
            [rows],
        )?;
        Ok::<_, rusqlite::Error>(Vec::new())
    })
    .await?;
    Ok(())
}

/// Writes `n` requests of about 1 KB each.
async fn write(org: &Org, prefix: &str, n: usize) -> R {
    for i in 0..n {
        let key = format!("{prefix}-{i}");
        let k = key.clone();
        org.once(&key, move |tx| {
            tx.execute(
                "INSERT INTO effects (key, org) VALUES (?1, hex(randomblob(512)))",
                [&k],
            )?;
            Ok::<_, rusqlite::Error>(Vec::new())
        })
        .await?;
    }
    Ok(())
}

async fn newest_entry(replica: &Replica, org: &OrgId) -> Result<LogEntry, BoxErr> {
    let log = replica.history(org).await?;
    Ok(log
        .into_iter()
        .rev()
        .find(|e| e.is_snapshot() || e.is_delta())
        .ok_or("nothing published")?)
}

/// A registry whose full snapshots come only from the chain's start (a budget large enough
/// for these short runs), so every full ship a test sees is one a claim chose.
fn reg(data: &Path, replica: Replica, writer: &str) -> Result<Registry, BoxErr> {
    let settings = RegistrySettings {
        ship: idem_replica::ShipPolicy {
            delta_budget_percent: 100_000,
            ..idem_replica::ShipPolicy::default()
        },
        ..RegistrySettings::default()
    };
    registry(data, replica, writer, settings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_continues_the_chain_with_a_delta_far_below_a_snapshot() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let acme = OrgId::new("acme")?;
    let a = reg(
        &dir.path().join("a"),
        replica(store.clone(), None).await?,
        "A",
    )?;
    let org_a = a.acquire(&acme).await?;
    bulk(&org_a, "bulk", 300).await?;
    write(&org_a, "a", 5).await?;
    let full = org_a.stats().full_bytes;
    assert_eq!(org_a.stats().full_ships, 1, "the org's first ship is full");
    for (_, r) in a.shutdown().await {
        r?;
    }

    // Another host: it hydrates, and its first ship continues A's chain.
    let b = reg(
        &dir.path().join("b"),
        replica(store.clone(), None).await?,
        "B",
    )?;
    let org_b = b.acquire(&acme).await?;
    write(&org_b, "b", 1).await?;
    let s = org_b.stats();
    assert_eq!((s.ships, s.full_ships), (1, 0), "{s:?}");
    assert!(
        s.bytes_shipped * 20 < full,
        "first ship after a handoff: {} bytes, a full snapshot was {full}",
        s.bytes_shipped
    );
    let entry = newest_entry(b.replica(), &acme).await?;
    let link = entry.delta().ok_or("B's first ship is not a delta")?;
    assert_eq!(entry.round(), org_b.round());
    let log = b.replica().history(&acme).await?;
    let base = log
        .iter()
        .find(|e| e.seq() == link.base)
        .ok_or("base missing")?;
    assert!(base.round() < org_b.round(), "the base is A's tip");
    eprintln!(
        "handoff: full snapshot {full} bytes, successor's first ship {} bytes",
        s.bytes_shipped
    );
    let report = b.replica().verify(&acme).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    b.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_across_three_rounds_restores_every_acknowledged_state() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let acme = OrgId::new("acme")?;
    let mut states: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut last = Vec::new();
    for (i, w) in ["A", "B", "C"].iter().enumerate() {
        let r = reg(&dir.path().join(w), replica(store.clone(), None).await?, w)?;
        let org = r.acquire(&acme).await?;
        for step in 0..4 {
            write(&org, &format!("{w}{step}"), 1 + step).await?;
            if step == 2 {
                org.vacuum().await?;
            }
            let entry = newest_entry(r.replica(), &acme).await?;
            last = image(&org).await?;
            states.push((entry.seq(), last.clone()));
        }
        let s = org.stats();
        assert_eq!(s.full_ships, u64::from(i == 0), "round {i}: {s:?}");
        for (_, res) in r.shutdown().await {
            res?;
        }
    }
    let check = replica(store.clone(), None).await?;
    let tmp = tempfile::tempdir()?;
    for (seq, want) in &states {
        let dest = tmp.path().join(format!("at-{seq}.db"));
        check.restore(&acme, Some(*seq), &dest).await?;
        assert!(std::fs::read(&dest)? == *want, "restore --at {seq} differs");
    }
    let report = check.verify(&acme).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(report.ok.len() >= states.len(), "{:?}", report.ok);
    // The newest, through a hydrate by a fourth writer.
    let d = reg(&dir.path().join("d"), replica(store, None).await?, "D")?;
    let org = d.acquire(&acme).await?;
    assert!(
        same_state(&image(&org).await?, &last),
        "hydrate of the newest state differs"
    );
    d.shutdown().await;
    Ok(())
}

/// A store that fails every GET of a blob: an acquire that succeeds on it downloaded none.
async fn no_blob_downloads(store: &FaultStore) {
    store.inject_times(Op::Get, "/snap/", 1, u64::MAX, Fault::FailBefore);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reacquire_after_a_clean_release_downloads_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(FaultStore::new(Arc::new(InMemory::new())));
    let data = dir.path().join("data");
    let acme = OrgId::new("acme")?;
    let a = reg(&data, replica(store.clone(), None).await?, "A")?;
    let org = a.acquire(&acme).await?;
    write(&org, "a", 50).await?;
    let want = image(&org).await?;
    for (_, r) in a.shutdown().await {
        r?;
    }

    no_blob_downloads(&store).await;
    let a2 = reg(&data, replica(store.clone(), None).await?, "A")?;
    let before = a2.replica().store_requests();
    let org = a2.acquire(&acme).await?;
    let during = a2.replica().store_requests().get - before.get;
    assert!(image(&org).await? == want, "the reused file is the state");
    let out = org.once("a-3", effect("acme", "again")).await?;
    assert!(!out.applied, "acknowledged keys replay");
    write(&org, "a2", 2).await?;
    let s = org.stats();
    assert_eq!(s.full_ships, 0, "the chain goes on from the reused file");
    eprintln!("re-acquire: {during} GETs (log entries and lease), no blob");
    for (_, r) in a2.shutdown().await {
        r?;
    }
    store.clear();
    let report = replica(store, None).await?.verify(&acme).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    Ok(())
}

/// Re-acquires `org` on host A (data `data`) after its kept file went `bad`: with blob
/// downloads failing the acquire must fail (the file is not trusted, so it downloads), and
/// once the store serves again the org holds `want`, the published state.
async fn downloaded_over(
    data: &Path,
    store: &Arc<FaultStore>,
    org: &OrgId,
    want: &[u8],
    bad: &str,
) -> Result<(Registry, Org), BoxErr> {
    no_blob_downloads(store).await;
    let a2 = reg(data, replica(store.clone(), None).await?, "A")?;
    assert!(
        a2.acquire(org).await.is_err(),
        "a {bad} file must not be served: the acquire has to download"
    );
    store.clear();
    let handle = a2.acquire(org).await?;
    assert!(
        same_state(&image(&handle).await?, want),
        "the published state, not the {bad} file"
    );
    Ok((a2, handle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_kept_file_is_downloaded_over_and_serves_the_newest_state() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(FaultStore::new(Arc::new(InMemory::new())));
    let data = dir.path().join("data");
    let acme = OrgId::new("acme")?;
    let a = reg(&data, replica(store.clone(), None).await?, "A")?;
    write(&a.acquire(&acme).await?, "a", 10).await?;
    a.shutdown().await;
    // Another host moves the org on while A's file sits in its cache.
    let b = reg(
        &dir.path().join("b"),
        replica(store.clone(), None).await?,
        "B",
    )?;
    let org_b = b.acquire(&acme).await?;
    write(&org_b, "b", 5).await?;
    let want = image(&org_b).await?;
    b.shutdown().await;

    let (a2, org) = downloaded_over(&data, &store, &acme, &want, "stale").await?;
    let out = org.once("b-4", effect("acme", "again")).await?;
    assert!(!out.applied);
    a2.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_file_with_one_byte_changed_is_downloaded_over() -> R {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(FaultStore::new(Arc::new(InMemory::new())));
    let data = dir.path().join("data");
    let acme = OrgId::new("acme")?;
    let a = reg(&data, replica(store.clone(), None).await?, "A")?;
    let org = a.acquire(&acme).await?;
    write(&org, "a", 20).await?;
    let want = image(&org).await?;
    a.shutdown().await;
    let kept = std::fs::read_dir(data.join("orgs").join("acme"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "db"))
        .ok_or("no kept file")?;
    let mut bytes = std::fs::read(&kept)?;
    let at = bytes.len() - 100; // inside the last page's cells
    bytes[at] ^= 0x01;
    std::fs::write(&kept, &bytes)?;

    let (a2, _org) = downloaded_over(&data, &store, &acme, &want, "tampered").await?;
    a2.shutdown().await;
    Ok(())
}

/// A claim that reused its kept file (no hydrate, so it never read the chain's manifest)
/// still names the unchanged segments of the chain's snapshot in its first full snapshot,
/// finds that manifest without listing the log again, and that snapshot restores to the
/// served state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_snapshot_after_a_reused_file_uploads_only_changed_segments() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let data = dir.path().join("data");
    let acme = OrgId::new("acme")?;
    let small_segments = || async {
        Replica::open(
            store.clone(),
            "t",
            idem_replica::Settings {
                segment_bytes: 16 << 10,
                ..idem_replica::Settings::default()
            },
        )
        .await
    };
    let a = reg(&data, small_segments().await?, "A")?;
    let org = a.acquire(&acme).await?;
    bulk(&org, "bulk", 400).await?;
    let first = org.stats().full_bytes;
    for (_, r) in a.shutdown().await {
        r?;
    }
    // Every ship of the second claim is a full snapshot.
    let every_ship_full = RegistrySettings {
        ship: idem_replica::ShipPolicy {
            max_deltas: 0,
            ..idem_replica::ShipPolicy::default()
        },
        ..RegistrySettings::default()
    };
    let a2 = registry(&data, small_segments().await?, "A", every_ship_full)?;
    let org = a2.acquire(&acme).await?;
    let before = a2.replica().store_requests();
    write(&org, "a2", 1).await?;
    // The chain's manifest is found in the claim's own listing, not by listing the log again.
    let spent = a2.replica().store_requests().since(&before);
    assert_eq!(
        spent.list, 0,
        "the first snapshot listed the log: {spent:?}"
    );
    let s = org.stats();
    assert_eq!(s.full_ships, 1, "{s:?}");
    assert!(
        s.full_bytes * 4 < first,
        "the reused file's first snapshot uploaded {} bytes, the whole database is {first}",
        s.full_bytes
    );
    let want = image(&org).await?;
    for (_, r) in a2.shutdown().await {
        r?;
    }
    let restored = dir.path().join("restored.db");
    small_segments()
        .await?
        .restore(&acme, None, &restored)
        .await?;
    assert!(
        same_state(&std::fs::read(&restored)?, &want),
        "restore differs"
    );
    Ok(())
}

/// `Org::full_snapshot_next` makes the next ship a full snapshot (once), which names the
/// previous snapshot's unchanged segments; the ship after it is a delta again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_full_snapshot_ships_once_and_reuses_segments() -> R {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let replica = Replica::open(
        store,
        "t",
        idem_replica::Settings {
            segment_bytes: 16 << 10,
            ..idem_replica::Settings::default()
        },
    )
    .await?;
    let a = reg(&dir.path().join("a"), replica, "A")?;
    let org = a.acquire(&OrgId::new("acme")?).await?;
    bulk(&org, "bulk", 300).await?;
    let before = org.stats();
    org.full_snapshot_next().await;
    write(&org, "forced", 1).await?;
    let forced = org.stats();
    assert_eq!(forced.full_ships, before.full_ships + 1, "{forced:?}");
    let uploaded = forced.full_bytes - before.full_bytes;
    assert!(
        uploaded * 4 < before.full_bytes,
        "the requested snapshot uploaded {uploaded} bytes, the first {}",
        before.full_bytes
    );
    write(&org, "after", 1).await?;
    assert_eq!(
        org.stats().full_ships,
        forced.full_ships,
        "one full snapshot only"
    );
    a.shutdown().await;
    Ok(())
}
