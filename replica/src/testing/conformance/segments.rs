//! Segmented snapshots: only changed segments upload, a segment two snapshots share outlives
//! the older one's retention, and a missing, damaged or crafted segment or manifest is a typed
//! error with nothing installed (I10, I11).

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};

use super::db::{Db, Writer};
use super::{CaseResult, log_path};
use crate::{Error, Retention, Settings, Shipped, Snapshot};

/// 4 KiB segments over 1 KiB pages: a few hundred rows make dozens of segments.
fn settings() -> Settings {
    Settings {
        segment_bytes: 4096,
        ..Settings::default()
    }
}

/// Rows `from..to` of 200 bytes each.
fn rows(from: u32, to: u32) -> String {
    format!(
        "WITH RECURSIVE c(i) AS (SELECT {from} UNION ALL SELECT i + 1 FROM c WHERE i < {to})
         INSERT INTO t(id, v) SELECT i, zeroblob(100) || randomblob(100) FROM c;"
    )
}

/// The segment names a snapshot's manifest lists, read straight from the store.
async fn segments_of(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
    shipped: &Shipped,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let bytes = store
        .get(&Path::from(shipped.blob.as_str()))
        .await?
        .bytes()
        .await?;
    let m: serde_json::Value = serde_json::from_slice(&bytes)?;
    let names = m["segments"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| {
                    s[0].as_str()
                        .map(|n| format!("{prefix}/orgs/acme/snap/{n}"))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(names)
}

async fn exists(store: &Arc<dyn ObjectStore>, path: &str) -> bool {
    store.head(&Path::from(path)).await.is_ok()
}

/// A second snapshot after a small change uploads the changed segments and names the rest;
/// one segment two snapshots share survives the older snapshot's retention, the older's own
/// segments do not, and the newer restores byte for byte.
pub(super) async fn a_segment_shared_by_two_snapshots_survives_retention_of_the_older(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let mut w = Writer::start_with(store.clone(), "w", &rows(1, 400), settings()).await?;
    let first = w.replica.history(&w.org).await?;
    let s1 = first
        .iter()
        .rev()
        .find_map(|e| w.replica.shipped(&w.org, e))
        .ok_or("no snapshot")?;
    w.db.exec("UPDATE t SET v = zeroblob(200) WHERE id = 399;")?;
    let image = w.db.image()?;
    let s2 = w
        .replica
        .ship(&mut w.claim, Snapshot::from_bytes(image.clone(), 2))
        .await?;
    assert!(
        s2.uploaded_bytes * 4 < s2.compressed_bytes,
        "a one-row change uploaded {} of {} bytes",
        s2.uploaded_bytes,
        s2.compressed_bytes
    );
    let old = segments_of(&store, &w.prefix, &s1).await?;
    let new = segments_of(&store, &w.prefix, &s2).await?;
    let shared: Vec<&String> = old.iter().filter(|n| new.contains(n)).collect();
    let only_old: Vec<&String> = old.iter().filter(|n| !new.contains(n)).collect();
    assert!(
        !shared.is_empty() && !only_old.is_empty(),
        "{old:?} {new:?}"
    );
    let policy = Retention {
        keep_snapshots: 1,
        keep_ms: 0,
        window_ms: 0,
        level_ms: 0,
    };
    // From another handle, as a cron job would run it: it reads the kept manifest itself.
    let cron = crate::Replica::open(store.clone(), &w.prefix, settings()).await?;
    let report = cron.retain(&w.org, &policy).await?;
    assert!(report.deleted_entries.contains(&s1.seq), "{report:?}");
    for n in &shared {
        assert!(exists(&store, n).await, "shared segment {n} was deleted");
    }
    for n in &only_old {
        assert!(!exists(&store, n).await, "{n} outlived its only snapshot");
    }
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("restored.db");
    w.replica.restore(&w.org, None, &dest).await?;
    assert!(std::fs::read(&dest)? == image, "restore differs");
    Ok(())
}

/// How one case damages the newest snapshot.
enum Damage {
    DeleteSegment,
    FlipSegment,
    /// A manifest rewritten (and renamed to its new sha256, with the entry pointing at it) to
    /// another shape.
    Manifest(fn(&mut serde_json::Value)),
}

/// A missing or corrupt segment and a crafted manifest (sizes, counts, names) are each a
/// typed error: hydrate installs nothing and leaves no temp file, verify names the snapshot.
pub(super) async fn segments_and_manifests_are_checked(store: Arc<dyn ObjectStore>) -> CaseResult {
    let cases: [(&str, Damage); 7] = [
        ("missing segment", Damage::DeleteSegment),
        ("corrupt segment", Damage::FlipSegment),
        (
            "one segment too few",
            Damage::Manifest(|m| {
                if let Some(a) = m["segments"].as_array_mut() {
                    a.pop();
                }
            }),
        ),
        (
            "page count off",
            Damage::Manifest(|m| m["pages"] = (m["pages"].as_u64().unwrap_or(0) + 1).into()),
        ),
        (
            "huge segments",
            Damage::Manifest(|m| m["segment_pages"] = (1u64 << 30).into()),
        ),
        (
            "zero pages per segment",
            Damage::Manifest(|m| m["segment_pages"] = 0.into()),
        ),
        (
            "a path in a segment name",
            Damage::Manifest(|m| m["segments"][0][0] = "../../log/x.seg.zst".into()),
        ),
    ];
    for (what, damage) in cases {
        let mut w = Writer::start_with(store.clone(), "w", &rows(1, 100), settings()).await?;
        w.db.exec("UPDATE t SET v = zeroblob(1) WHERE id = 1;")?;
        let s = w
            .replica
            .ship(&mut w.claim, Snapshot::from_bytes(w.db.image()?, 2))
            .await?;
        let segs = segments_of(&store, &w.prefix, &s).await?;
        let victim = Path::from(segs.last().ok_or("no segments")?.as_str());
        match damage {
            Damage::DeleteSegment => store.delete(&victim).await?,
            Damage::FlipSegment => {
                let mut b = store.get(&victim).await?.bytes().await?.to_vec();
                let mid = b.len() / 2;
                b[mid] ^= 0x20;
                store.put(&victim, PutPayload::from(b)).await?;
            }
            Damage::Manifest(edit) => {
                let path = Path::from(s.blob.as_str());
                let mut m: serde_json::Value =
                    serde_json::from_slice(&store.get(&path).await?.bytes().await?)?;
                edit(&mut m);
                let bytes = serde_json::to_vec(&m)?;
                let name = crate::format::manifest::manifest_name(
                    s.seq,
                    s.round,
                    &hex::encode(Sha256::digest(&bytes)),
                );
                let new_path = format!("{}/orgs/acme/snap/{name}", w.prefix);
                store
                    .put(&Path::from(new_path.as_str()), PutPayload::from(bytes))
                    .await?;
                let entry_path = log_path(&w.prefix, s.seq);
                let entry = store.get(&entry_path).await?.bytes().await?;
                let old_name = s.blob.rsplit('/').next().unwrap_or_default();
                let text = String::from_utf8(entry.to_vec())?.replace(old_name, &name);
                store
                    .put(&entry_path, PutPayload::from(text.into_bytes()))
                    .await?;
            }
        }
        w.replica.release(&mut w.claim).await?;
        let mut next = w.replica.claim(&w.org, "next", false).await?;
        let dir = tempfile::tempdir()?;
        let dest = dir.path().join("db");
        let got = w.replica.hydrate(&mut next, &dest).await;
        assert!(
            matches!(
                got,
                Err(Error::MissingObject { .. } | Error::Corrupt { .. })
            ),
            "{what}: {got:?}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path())?.collect();
        assert!(
            left.is_empty(),
            "{what}: something was left at the destination"
        );
        let report = w.replica.verify(&w.org).await?;
        assert!(
            report.failed.iter().any(|(seq, _)| *seq == s.seq),
            "{what}: verify passed {:?}",
            report.ok
        );
    }
    Ok(())
}

/// A snapshot streamed from a database file equals the one taken in memory, restores at
/// every position, and the file is only read.
pub(super) async fn a_database_file_ships_as_a_streamed_snapshot(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let mut w = Writer::start_with(store.clone(), "w", &rows(1, 300), settings()).await?;
    let dir = tempfile::tempdir()?;
    let src = dir.path().join("tenant.db");
    let mut db = Db::new()?;
    db.exec(&rows(1, 500))?;
    let image = db.image()?;
    std::fs::write(&src, &image)?;
    let shipped = w.replica.ship_file(&mut w.claim, &src, 7).await?;
    assert_eq!((shipped.bytes, shipped.commit), (image.len() as u64, 7));
    assert!(std::fs::read(&src)? == image, "the source file changed");
    let dest = dir.path().join("restored.db");
    let restored = w.replica.restore(&w.org, Some(shipped.seq), &dest).await?;
    assert_eq!(restored.commit, 7);
    assert!(std::fs::read(&dest)? == image, "restore differs");
    let bad = dir.path().join("not-a-db");
    std::fs::write(&bad, b"hello")?;
    assert!(matches!(
        w.replica.ship_file(&mut w.claim, &bad, 8).await,
        Err(Error::InvalidSnapshot { .. })
    ));
    Ok(())
}
