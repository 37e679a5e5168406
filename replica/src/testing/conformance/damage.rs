//! Damage: a broken chain, a delta without its snapshot, a crafted delta size, each a
//! typed error with nothing installed (I10); and a failed apply that does not wait on the
//! fetch beside it.

use std::sync::Arc;

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sha2::Digest;

use super::db::Writer;
use super::delta::ship_chain;
use super::{CaseResult, log_path, open, org, prefix};
use crate::testing::fault::{FaultStore, Op};
use crate::{BLOB_MAGIC, BLOB_VERSION, Error, ErrorKind, LogEntry, Replica, Settings};

/// The JSON object stored at `path`.
async fn read_json(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
) -> Result<serde_json::Value, Box<dyn std::error::Error + Send + Sync>> {
    Ok(serde_json::from_slice(
        &store.get(path).await?.bytes().await?,
    )?)
}

/// Rewrites the log entry at `seq` with `edit` applied (bypassing create-only, as damage).
async fn tamper(
    store: &Arc<dyn ObjectStore>,
    pfx: &str,
    seq: u64,
    edit: impl FnOnce(&mut serde_json::Value),
) -> CaseResult {
    let path = log_path(pfx, seq);
    let mut v = read_json(store, &path).await?;
    edit(&mut v);
    store
        .put(&path, PutPayload::from(serde_json::to_vec(&v)?))
        .await?;
    Ok(())
}

/// A missing delta, a delta moved to another position, a wrong checksum and a bit-flipped
/// delta blob each fail hydrate with a typed error and install nothing (I10).
pub(super) async fn broken_delta_chain_is_a_typed_error(store: Arc<dyn ObjectStore>) -> CaseResult {
    type Damage = fn(u64) -> (u64, &'static str);
    let cases: [(&str, Damage); 7] = [
        ("missing", |first| (first + 1, "delete")),
        ("foreign base", |first| (first + 1, "rebase")),
        ("reordered", |first| (first + 1, "swap")),
        ("checksum", |first| (first + 2, "checksum")),
        ("bitflip", |first| (first + 3, "flip")),
        ("inline not base64", |first| (first + 3, "garble")),
        ("inline of another size", |first| (first + 3, "resize")),
    ];
    for (name, damage) in cases {
        let pfx = prefix()?;
        let r = open(store.clone(), &pfx).await?;
        let acme = org("acme");
        let mut a = r.claim(&acme, "a", false).await?;
        let images = ship_chain(&r, &mut a).await?;
        r.release(&mut a).await?;
        let first_delta = images[1].0;
        let (seq, how) = damage(first_delta);
        match how {
            "delete" => store.delete(&log_path(&pfx, seq)).await?,
            "rebase" => tamper(&store, &pfx, seq, |v| v["base"] = (seq + 1).into()).await?,
            "swap" => {
                let (first, second) = (
                    read_json(&store, &log_path(&pfx, seq)).await?,
                    read_json(&store, &log_path(&pfx, seq + 1)).await?,
                );
                tamper(&store, &pfx, seq, |v| {
                    *v = second;
                    v["seq"] = seq.into();
                })
                .await?;
                tamper(&store, &pfx, seq + 1, |v| {
                    *v = first;
                    v["seq"] = (seq + 1).into();
                })
                .await?;
            }
            "checksum" => {
                tamper(&store, &pfx, seq, |v| {
                    v["checksum"] = "0000000000000000".into()
                })
                .await?
            }
            // A small delta's body is inside its entry: damage it there.
            "flip" | "garble" | "resize"
                if read_json(&store, &log_path(&pfx, seq)).await?["inline"].is_string() =>
            {
                tamper(&store, &pfx, seq, |v| {
                    let text = v["inline"].as_str().unwrap_or_default();
                    let mut bytes = BASE64_STANDARD.decode(text).unwrap_or_default();
                    let mid = bytes.len() / 2;
                    match how {
                        "flip" => bytes[mid] ^= 0x40,
                        "resize" => bytes.push(0),
                        _ => {}
                    }
                    v["inline"] = match how {
                        "garble" => "not base64!".into(),
                        _ => BASE64_STANDARD.encode(&bytes).into(),
                    };
                })
                .await?
            }
            "garble" | "resize" => return Err(format!("{name}: the delta is not inline").into()),
            _ => {
                let entry = r.history(&acme).await?;
                let blob = entry
                    .iter()
                    .find(|e| e.seq() == seq)
                    .and_then(LogEntry::blob)
                    .map(str::to_owned)
                    .unwrap_or_default();
                let path = Path::from(format!("{pfx}/orgs/acme/snap/{blob}"));
                let mut bytes = store.get(&path).await?.bytes().await?.to_vec();
                let mid = bytes.len() / 2;
                bytes[mid] ^= 0x40;
                store.put(&path, PutPayload::from(bytes)).await?;
            }
        }
        let mut b = r.claim(&acme, "b", false).await?;
        let tmp = tempfile::tempdir()?;
        let dest = tmp.path().join("db");
        let got = r.hydrate(&mut b, &dest).await;
        let typed = match how {
            "flip" | "garble" | "resize" => matches!(&got, Err(Error::Corrupt { .. })),
            _ => matches!(&got, Err(Error::ChainBroken { .. })),
        };
        assert!(typed, "{name}: {got:?}");
        assert!(!dest.exists(), "{name}: something was installed");
    }
    Ok(())
}

/// A delta entry with no snapshot below it (e.g. retention interrupted after deleting the
/// snapshot entry but before its deltas: snapshot entries are deleted first) is a position the
/// CLI lists; `restore --at` it must fail, not "restore" an empty database over `dest`.
pub(super) async fn restore_at_a_delta_without_its_snapshot_is_an_error_not_an_empty_db(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let mut w = Writer::start(store.clone(), "w", "INSERT INTO t(v) VALUES (1);").await?;
    let d = w.ship_change("INSERT INTO t(v) VALUES (2);", 2).await?;
    // The snapshot entry goes (as an interrupted retention run would leave it).
    store.delete(&log_path(&w.prefix, d.seq - 1)).await?;
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("restored.db");
    std::fs::write(&dest, b"the operator's previous file")?;
    let got = w.replica.restore(&w.org, Some(d.seq), &dest).await;
    assert!(
        got.is_err(),
        "restore --at {} succeeded with {got:?}; dest exists: {}",
        d.seq,
        dest.exists()
    );
    Ok(())
}

/// A delta entry + blob claiming db_pages = u32::MAX (store data, shapes consistent) made
/// `verify` panic (u32 overflow) and restore fail with a Task error; it is Corrupt, and
/// nothing is allocated for pages the body does not carry.
pub(super) async fn a_delta_with_a_huge_db_size_is_corrupt_not_a_panic(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let mut w = Writer::start(store.clone(), "w", "INSERT INTO t(v) VALUES (1);").await?;
    // A delta that changes nothing, then made to claim u32::MAX pages.
    let d = w.ship_change("", 1).await?;
    let (pfx, replica, org, ps) = (w.prefix, w.replica, w.org, 1024u32);
    // Rewrite blob and entry consistently: body = page_size, u32::MAX pages, 0 changed.
    let mut body = Vec::new();
    body.extend_from_slice(&ps.to_le_bytes());
    body.extend_from_slice(&u32::MAX.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    let mut blob = BLOB_MAGIC.to_vec();
    blob.extend_from_slice(&BLOB_VERSION.to_le_bytes());
    blob.extend_from_slice(&zstd::encode_all(&body[..], 1)?);
    let sha = hex::encode(sha2::Sha256::digest(&body));
    let entry_path = log_path(&pfx, d.seq);
    let mut v = read_json(&store, &entry_path).await?;
    v["db_pages"] = u32::MAX.into();
    v["sha256"] = sha.into();
    v["bytes"] = (body.len() as u64).into();
    v["compressed_bytes"] = (blob.len() as u64).into();
    match v["blob"].as_str().map(str::to_owned) {
        Some(blob_name) => {
            store
                .put(
                    &Path::from(format!("{pfx}/orgs/acme/snap/{blob_name}")),
                    PutPayload::from(blob),
                )
                .await?;
        }
        None => v["inline"] = BASE64_STANDARD.encode(&blob).into(),
    }
    store
        .put(&entry_path, PutPayload::from(serde_json::to_vec(&v)?))
        .await?;

    let dir = tempfile::tempdir()?;
    let restored = replica.restore(&org, None, &dir.path().join("x.db")).await;
    let (r2, o2) = (replica.clone(), org.clone());
    let verified = tokio::spawn(async move { r2.verify(&o2).await.map(|r| r.failed.len()) }).await;
    assert!(
        verified.is_ok(),
        "verify panicked on a crafted delta: {:?}",
        verified.err()
    );
    let kind = restored.as_ref().err().map(Error::kind);
    assert_eq!(kind, Some(ErrorKind::Corrupt), "{restored:?}");
    Ok(())
}

/// Hydrate applies a batch of deltas while it fetches the next. It used to wait for the
/// whole next batch even after the apply failed, so a stalled GET held a broken chain's
/// error (and the caller) as long as the store client allowed; the apply error now returns
/// at once. The GET of a delta in the second batch is held (never resumed) while the first
/// batch fails its checksum.
pub(super) async fn a_failed_apply_returns_without_waiting_for_the_next_fetch(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    // Every delta gets a blob: the held GET is a blob's.
    let blobs = Settings {
        inline_delta_bytes: 0,
        ..Settings::default()
    };
    let mut w = Writer::start_with(store.clone(), "w", "", blobs).await?;
    let held = Arc::new(FaultStore::new(store.clone()));
    let two = Settings {
        read_concurrency: 2,
        ..Settings::default()
    };
    let reader = Replica::open(held.clone(), &w.prefix, two).await?;
    let mut deltas = Vec::new();
    for commit in 2..=6 {
        deltas.push(
            w.ship_change("INSERT INTO t(v) VALUES (randomblob(300))", commit)
                .await?,
        );
    }
    let (pfx, org) = (w.prefix, w.org);
    // The first delta's checksum after it is wrong: the first batch (deltas 1-2) fails.
    let entry_path = log_path(&pfx, deltas[0].seq);
    let mut v = read_json(&store, &entry_path).await?;
    v["checksum"] = "0000000000000000".into();
    store
        .put(&entry_path, PutPayload::from(serde_json::to_vec(&v)?))
        .await?;
    // The third delta's blob (second batch) never arrives while the test runs.
    let blob = deltas[2]
        .blob
        .rsplit('/')
        .next()
        .ok_or("no blob name")?
        .to_owned();
    let pause = held.pause_next(Op::Get, &blob);
    let dir = tempfile::tempdir()?;
    let dest = dir.path().join("x.db");
    let (r2, o2, d2) = (reader.clone(), org.clone(), dest.clone());
    let restore = tokio::spawn(async move { r2.restore(&o2, None, &d2).await });
    let got = tokio::time::timeout(std::time::Duration::from_secs(60), restore)
        .await
        .map_err(|_| "restore waited for the held GET after its apply failed")??;
    assert!(matches!(got, Err(Error::ChainBroken { .. })), "{got:?}");
    assert!(!dest.exists(), "nothing is installed");
    drop(pause);
    Ok(())
}
