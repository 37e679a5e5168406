//! A crafted manifest (and the entry naming it) that claims billions of pages is a
//! typed error, never an allocation the download does not bound (I10). Its own test binary:
//! on the code it probes, the failure is an abort that would take other tests with it.

use std::sync::Arc;

use idem_replica::conformance::test_snapshot;
use idem_replica::{Error, OrgId, Replica, Settings};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_claiming_billions_of_pages_is_a_typed_error_not_an_abort() -> R {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let r = Replica::open(store.clone(), "t", Settings::default()).await?;
    let org = OrgId::new("acme")?;
    let mut c = r.claim(&org, "w", false).await?;
    let s = r.ship(&mut c, test_snapshot(10)?).await?;
    r.release(&mut c).await?;
    // 2^32 - 1 pages of 512 bytes in segments of 64 MiB (the most a manifest may name):
    // 32 768 segments, a ~3 MB manifest, well under MAX_MANIFEST_BYTES. Every field is
    // individually valid; the entry agrees on the size (2 TiB).
    let (page_size, pages, segment_pages) = (512u64, u64::from(u32::MAX), 131_072u64);
    let n = pages.div_ceil(segment_pages);
    let segments: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let sha = hex::encode(Sha256::digest(i.to_le_bytes()));
            serde_json::json!([format!("{:020}-{}-{sha}.seg.zst", s.seq, s.round), 100])
        })
        .collect();
    let m = serde_json::json!({"v": 1, "page_size": page_size, "pages": pages,
        "segment_pages": segment_pages, "segments": segments});
    let bytes = serde_json::to_vec(&m)?;
    let name = format!(
        "{:020}-{}-{}.manifest.json",
        s.seq,
        s.round,
        hex::encode(Sha256::digest(&bytes))
    );
    store
        .put(
            &Path::from(format!("t/orgs/acme/snap/{name}")),
            PutPayload::from(bytes),
        )
        .await?;
    let entry_path = Path::from(format!("t/orgs/acme/log/{:020}.json", s.seq));
    let mut e: serde_json::Value =
        serde_json::from_slice(&store.get(&entry_path).await?.bytes().await?)?;
    e["manifest"] = name.into();
    e["bytes"] = (pages * page_size).into();
    store
        .put(&entry_path, PutPayload::from(serde_json::to_vec(&e)?))
        .await?;

    let dir = tempfile::tempdir()?;
    let mut next = r.claim(&org, "next", false).await?;
    let got = r.hydrate(&mut next, &dir.path().join("db")).await;
    assert!(
        matches!(
            got,
            Err(Error::MissingObject { .. } | Error::Corrupt { .. })
        ),
        "{got:?}"
    );
    assert_eq!(std::fs::read_dir(dir.path())?.count(), 0, "a file was left");
    let report = r.verify(&org).await?;
    assert!(
        report.failed.iter().any(|(seq, _)| *seq == s.seq),
        "{report:?}"
    );
    Ok(())
}
