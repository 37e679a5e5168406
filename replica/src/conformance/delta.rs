//! Conformance of delta shipping: chains hydrate and restore byte for byte, damage is a typed
//! error (I10), fencing and retention hold with deltas (I7, I11).

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rusqlite::{Connection, MAIN_DB};

use super::{PauseAt, TempDir, open, org, prefix};
use crate::delta::canonical_page1;
use crate::{Delta, Error, FailPoint, LogEntry, Retention, Snapshot};

/// An in-memory database whose exact image is read with `serialize`.
struct Db(Connection);

impl Db {
    fn new() -> Result<Db, Error> {
        let conn = Connection::open_in_memory().map_err(sql)?;
        conn.execute_batch(
            "PRAGMA page_size = 1024; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);",
        )
        .map_err(sql)?;
        Ok(Db(conn))
    }
    fn exec(&self, q: &str) -> Result<(), Error> {
        self.0.execute_batch(q).map_err(sql)
    }
    /// The canonical image (page 1 in rollback-journal form, as installed files are).
    fn image(&mut self) -> Result<Vec<u8>, Error> {
        let mut img = self.0.serialize(MAIN_DB).map_err(sql)?.to_vec();
        if img.len() >= 1024 {
            canonical_page1(&mut img[..1024]);
        }
        Ok(img)
    }
}

fn sql(source: rusqlite::Error) -> Error {
    Error::Sqlite {
        op: "building a delta test database",
        source,
    }
}

/// The pages of `next` that differ from `prev`, as a delta to `next`'s size.
pub(crate) fn diff(prev: &[u8], next: &[u8], commit: u64) -> Result<Delta, Error> {
    let ps = 1024;
    let mut pages = BTreeMap::new();
    for (i, page) in next.chunks(ps).enumerate() {
        if prev.get(i * ps..(i + 1) * ps) != Some(page) {
            pages.insert(i as u32 + 1, page.to_vec());
        }
    }
    Delta::new(ps as u32, (next.len() / ps) as u32, pages, commit)
}

/// Builds a chain: one snapshot of 20 rows, then one delta per step (inserts, an update, a
/// delete that shrinks the file after VACUUM, a schema change). Returns the images per seq.
async fn ship_chain(
    r: &crate::Replica,
    claim: &mut crate::Claim,
) -> Result<Vec<(u64, Vec<u8>)>, Error> {
    let mut db = Db::new()?;
    db.exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 20) INSERT INTO t SELECT i, randomblob(300) FROM n")?;
    let mut prev = db.image()?;
    let s = r.ship(claim, Snapshot::from_bytes(prev.clone(), 1)).await?;
    let mut images = vec![(s.seq, prev.clone())];
    let steps = [
        "INSERT INTO t VALUES (100, randomblob(2000))",
        "UPDATE t SET v = randomblob(10) WHERE id % 3 = 0",
        "CREATE TABLE u(k TEXT PRIMARY KEY, n INT); INSERT INTO u VALUES ('a', 1)",
        "DELETE FROM t WHERE id > 5; VACUUM",
        "ALTER TABLE u ADD COLUMN note TEXT; UPDATE u SET note = 'x'",
    ];
    for (i, step) in steps.iter().enumerate() {
        db.exec(step)?;
        let next = db.image()?;
        let mut delta = diff(&prev, &next, i as u64 + 2)?;
        if i % 2 == 0 {
            // Every other delta XOR-encodes its pages against the previous image.
            delta = delta.encode_against(|p| prev.get((p as usize - 1) * 1024..p as usize * 1024));
        }
        let shipped = r.ship_delta(claim, delta).await?;
        assert!(shipped.delta);
        assert_eq!(shipped.commit, i as u64 + 2);
        images.push((shipped.seq, next.clone()));
        prev = next;
    }
    Ok(images)
}

/// A snapshot plus deltas (growth, update, schema change, VACUUM shrink) hydrates to exactly
/// the writer's last image, and restore reaches every published position byte for byte.
///
/// # Errors
/// Unexpected failures.
pub async fn delta_chain_hydrates_and_restores_every_position(
    store: Arc<dyn ObjectStore>,
) -> Result<(), Error> {
    let r = open(store, &prefix()?).await?;
    let acme = org("acme");
    let mut a = r.claim(&acme, "a", false).await?;
    let images = ship_chain(&r, &mut a).await?;
    r.release(&mut a).await?;
    let b = r.claim(&acme, "b", false).await?;
    let tmp = TempDir::new()?;
    let h = r.hydrate(&b, &tmp.path().join("db")).await?;
    let (last_seq, last_image) = images.last().cloned().unwrap_or_default();
    assert_eq!(h.position, Some(last_seq));
    assert_eq!(h.deltas, images.len() - 1);
    assert_eq!(h.commit, images.len() as u64);
    let got = std::fs::read(tmp.path().join("db")).map_err(|e| Error::io(tmp.path(), e))?;
    assert!(
        got == last_image,
        "hydrated image differs from the writer's"
    );
    for (seq, image) in &images {
        let dest = tmp.path().join(format!("at-{seq}"));
        let h = r.restore(&acme, Some(*seq), &dest).await?;
        assert_eq!(h.position, Some(*seq));
        let got = std::fs::read(&dest).map_err(|e| Error::io(&dest, e))?;
        assert!(got == *image, "restore at {seq} differs");
    }
    let claim_seq = b.seq;
    assert!(matches!(
        r.restore(&acme, Some(claim_seq), &tmp.path().join("x"))
            .await,
        Err(Error::NoSuchSnapshot { .. })
    ));
    let report = r.verify(&acme).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.ok.len(), images.len());
    Ok(())
}

/// Rewrites the log entry at `seq` with `edit` applied (bypassing create-only, as damage).
async fn tamper(
    store: &Arc<dyn ObjectStore>,
    pfx: &str,
    seq: u64,
    edit: impl FnOnce(&mut serde_json::Value),
) -> Result<(), Error> {
    let path = object_store::path::Path::from(format!("{pfx}/orgs/acme/log/{seq:020}.json"));
    let body = store
        .get(&path)
        .await
        .map_err(|e| Error::store("get", &path, e))?
        .bytes()
        .await
        .map_err(|e| Error::store("get", &path, e))?;
    let mut v: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| crate::entry::corrupt("t", e))?;
    edit(&mut v);
    let out = serde_json::to_vec(&v).map_err(|e| crate::entry::corrupt("t", e))?;
    store
        .put(&path, PutPayload::from(out))
        .await
        .map_err(|e| Error::store("put", &path, e))?;
    Ok(())
}

/// A missing delta, a delta moved to another position, a wrong checksum and a bit-flipped
/// delta blob each fail hydrate with a typed error and install nothing (I10).
///
/// # Errors
/// Unexpected failures.
pub async fn broken_delta_chain_is_a_typed_error(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    type Damage = fn(u64) -> (u64, &'static str);
    let cases: [(&str, Damage); 5] = [
        ("missing", |first| (first + 1, "delete")),
        ("foreign base", |first| (first + 1, "rebase")),
        ("reordered", |first| (first + 1, "swap")),
        ("checksum", |first| (first + 2, "checksum")),
        ("bitflip", |first| (first + 3, "flip")),
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
            "delete" => {
                let path =
                    object_store::path::Path::from(format!("{pfx}/orgs/acme/log/{seq:020}.json"));
                store
                    .delete(&path)
                    .await
                    .map_err(|e| Error::store("delete", &path, e))?;
            }
            "rebase" => tamper(&store, &pfx, seq, |v| v["base"] = (seq + 1).into()).await?,
            "swap" => {
                let read = |s: u64| {
                    let path =
                        object_store::path::Path::from(format!("{pfx}/orgs/acme/log/{s:020}.json"));
                    let store = store.clone();
                    async move {
                        let b = store
                            .get(&path)
                            .await
                            .map_err(|e| Error::store("get", &path, e))?
                            .bytes()
                            .await
                            .map_err(|e| Error::store("get", &path, e))?;
                        serde_json::from_slice::<serde_json::Value>(&b)
                            .map_err(|e| crate::entry::corrupt("t", e))
                    }
                };
                let (first, second) = (read(seq).await?, read(seq + 1).await?);
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
            _ => {
                let entry = r.history(&acme).await?;
                let blob = entry
                    .iter()
                    .find(|e| e.seq() == seq)
                    .and_then(LogEntry::blob)
                    .map(str::to_owned)
                    .unwrap_or_default();
                let path = object_store::path::Path::from(format!("{pfx}/orgs/acme/snap/{blob}"));
                let mut bytes = store
                    .get(&path)
                    .await
                    .map_err(|e| Error::store("get", &path, e))?
                    .bytes()
                    .await
                    .map_err(|e| Error::store("get", &path, e))?
                    .to_vec();
                let mid = bytes.len() / 2;
                bytes[mid] ^= 0x40;
                store
                    .put(&path, PutPayload::from(bytes))
                    .await
                    .map_err(|e| Error::store("put", &path, e))?;
            }
        }
        let b = r.claim(&acme, "b", false).await?;
        let tmp = TempDir::new()?;
        let dest = tmp.path().join("db");
        let got = r.hydrate(&b, &dest).await;
        let typed = match how {
            "flip" => matches!(&got, Err(Error::Corrupt { .. })),
            _ => matches!(&got, Err(Error::ChainBroken { .. })),
        };
        assert!(typed, "{name}: {got:?}");
        assert!(!dest.exists(), "{name}: something was installed");
    }
    Ok(())
}

/// A delta needs a published snapshot in the same claim; a fenced claim's delta is refused
/// and never acknowledged (I7).
///
/// # Errors
/// Unexpected failures.
pub async fn delta_needs_a_snapshot_and_is_fenced(
    store: Arc<dyn ObjectStore>,
) -> Result<(), Error> {
    let r = open(store, &prefix()?).await?;
    let acme = org("acme");
    let mut db = Db::new()?;
    let img = db.image()?;
    let mut a = r.claim(&acme, "a", false).await?;
    let no_tip = r.ship_delta(&mut a, diff(&img, &img, 1)?).await;
    assert!(
        matches!(no_tip, Err(Error::NoChainTip { .. })),
        "{no_tip:?}"
    );
    r.ship(&mut a, Snapshot::from_bytes(img.clone(), 1)).await?;
    assert_eq!(a.chain_tip(), Some(a.seq + 1));
    db.exec("INSERT INTO t VALUES (1, x'00')")?;
    let next = db.image()?;
    r.ship_delta(&mut a, diff(&img, &next, 2)?).await?;
    let b = r.claim(&acme, "b", true).await?;
    db.exec("INSERT INTO t VALUES (2, x'01')")?;
    let late = db.image()?;
    let fenced = r.ship_delta(&mut a, diff(&next, &late, 3)?).await;
    assert!(matches!(fenced, Err(Error::Fenced { .. })), "{fenced:?}");
    let tmp = TempDir::new()?;
    let h = r.hydrate(&b, &tmp.path().join("db")).await?;
    assert_eq!(h.commit, 2);
    Ok(())
}

/// Retention deletes an old snapshot together with its deltas, keeps the newest snapshot's
/// chain whole, and hydrate still rebuilds the newest state (I11).
///
/// # Errors
/// Unexpected failures.
pub async fn retention_keeps_the_delta_chain(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    let r = open(store, &prefix()?).await?;
    let acme = org("acme");
    let mut a = r.claim(&acme, "a", false).await?;
    let old = ship_chain(&r, &mut a).await?;
    let new = ship_chain(&r, &mut a).await?;
    let report = r
        .retain(
            &acme,
            &Retention {
                keep_snapshots: 1,
                keep_ms: 0,
            },
        )
        .await?;
    for (seq, _) in &old {
        assert!(
            report.deleted_entries.contains(seq),
            "old chain entry {seq} kept"
        );
    }
    let left: Vec<u64> = r.history(&acme).await?.iter().map(LogEntry::seq).collect();
    for (seq, _) in &new {
        assert!(left.contains(seq), "newest chain entry {seq} deleted");
    }
    r.release(&mut a).await?;
    let b = r.claim(&acme, "b", false).await?;
    let tmp = TempDir::new()?;
    r.hydrate(&b, &tmp.path().join("db")).await?;
    let got = std::fs::read(tmp.path().join("db")).map_err(|e| Error::io(tmp.path(), e))?;
    assert!(new.last().is_some_and(|(_, img)| *img == got));
    Ok(())
}

/// A zombie's delta paused between upload and publish resumes after the successor shipped
/// and retention ran: the successor's claim still holds the zombie's slot (retention never
/// deletes claims), so the delta never lands and the zombie is fenced; its uploaded blob is an
/// orphan the next retention collects; hydrate and verify see only the successor (I7, I11).
///
/// # Errors
/// Unexpected failures.
pub async fn zombie_delta_is_fenced_and_collected(
    store: Arc<dyn ObjectStore>,
) -> Result<(), Error> {
    let p = prefix()?;
    let pause = PauseAt::new(FailPoint::ShipAfterUpload);
    let za = crate::Replica::open_with(
        store.clone(),
        &p,
        crate::Settings::default(),
        Arc::new(crate::SystemClock),
        Some(pause.clone()),
    )
    .await?;
    let rb = open(store, &p).await?;
    let o = org("acme");
    let mut db = Db::new()?;
    let first = db.image()?;
    let mut a = za.claim(&o, "a", false).await?;
    za.ship(&mut a, Snapshot::from_bytes(first.clone(), 1))
        .await?;
    db.exec("INSERT INTO t VALUES (7, x'07')")?;
    let delta = diff(&first, &db.image()?, 2)?;
    let handle = pause.arm().await;
    let zombie = {
        let (za, mut a) = (za.clone(), a.clone());
        tokio::spawn(async move { za.ship_delta(&mut a, delta).await })
    };
    handle.reached.await.map_err(|_| Error::InvalidSettings {
        reason: "zombie never paused".into(),
    })?;
    let mut b = rb.claim(&o, "b", true).await?;
    assert_eq!(
        b.seq,
        a.next_seq(),
        "the successor's claim is in the zombie's slot"
    );
    rb.ship(&mut b, super::test_snapshot(3)?).await?;
    let newest = rb.ship(&mut b, super::test_snapshot(4)?).await?;
    let keep_one = Retention {
        keep_snapshots: 1,
        keep_ms: 0,
    };
    let first_run = rb.retain(&o, &keep_one).await?;
    assert!(!first_run.deleted_entries.contains(&b.seq), "{first_run:?}");
    let _ = handle.resume.send(());
    let res = zombie.await.map_err(|source| Error::Task {
        op: "zombie",
        source,
    })?;
    assert!(
        matches!(res, Err(Error::Fenced { .. })),
        "zombie not fenced: {res:?}"
    );
    let log = rb.history(&o).await?;
    assert!(
        !log.iter().any(|e| matches!(e, LogEntry::Delta { .. })),
        "the zombie's delta landed: {log:?}"
    );
    rb.retain(&o, &keep_one).await?;
    let blobs: Vec<String> = {
        use futures::TryStreamExt;
        let dir = object_store::path::Path::from(format!("{p}/orgs/acme/snap"));
        rb.store()
            .list(Some(&dir))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .map_err(|e| Error::store("list", &dir, e))?
    };
    assert!(
        !blobs.iter().any(|b| b.ends_with(".delta.zst")),
        "the zombie's orphan blob survived retention: {blobs:?}"
    );
    let c = rb.claim(&o, "c", true).await?;
    let tmp = TempDir::new()?;
    let h = rb.hydrate(&c, &tmp.path().join("db")).await?;
    assert_eq!(h.position, Some(newest.seq));
    let report = rb.verify(&o).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    Ok(())
}

/// A compacted delta (every page changed since the snapshot) supersedes the deltas before
/// it: hydrate reads the snapshot, it and the deltas after it — and still works when a
/// superseded delta is gone — while restore reaches every position byte for byte. A
/// compacted delta that misses a changed page is refused before anything is published.
///
/// # Errors
/// Unexpected failures.
pub async fn compacted_delta_supersedes_the_chain(
    store: Arc<dyn ObjectStore>,
) -> Result<(), Error> {
    let pfx = prefix()?;
    let r = open(store.clone(), &pfx).await?;
    let acme = org("acme");
    let mut a = r.claim(&acme, "a", false).await?;
    let images = ship_chain(&r, &mut a).await?;
    let (snap_seq, snap_img) = images[0].clone();
    let mut db = Db(Connection::open_in_memory().map_err(sql)?);
    let last = images.last().map(|(_, i)| i.clone()).unwrap_or_default();
    db.0.deserialize_read_exact(rusqlite::MAIN_DB, &last[..], last.len(), false)
        .map_err(sql)?;
    db.exec("INSERT INTO u VALUES ('b', 2, 'y')")?;
    let now = db.image()?;
    // Missing a page changed since the snapshot: refused, nothing published.
    let mut partial = diff(&snap_img, &now, 90)?;
    let next = a.next_seq();
    let first_changed = partial.pages().keys().next().copied().unwrap_or(1);
    let pages: BTreeMap<u32, Vec<u8>> = partial
        .pages()
        .iter()
        .filter(|(p, _)| **p != first_changed)
        .map(|(p, v)| (*p, v.clone()))
        .collect();
    partial = Delta::new(1024, partial.db_pages(), pages, 90)?.compacted();
    let refused = r.ship_delta(&mut a, partial).await;
    assert!(
        matches!(refused, Err(Error::InvalidSnapshot { .. })),
        "{refused:?}"
    );
    assert_eq!(a.next_seq(), next);
    let compacted = r
        .ship_delta(&mut a, diff(&snap_img, &now, 90)?.compacted())
        .await?;
    let mut all = images.clone();
    all.push((compacted.seq, now.clone()));
    let mut prev = now;
    for i in 0..2u64 {
        db.exec(&format!(
            "INSERT INTO t VALUES ({}, randomblob(700))",
            500 + i
        ))?;
        let next = db.image()?;
        let d = r.ship_delta(&mut a, diff(&prev, &next, 91 + i)?).await?;
        all.push((d.seq, next.clone()));
        prev = next;
    }
    r.release(&mut a).await?;
    // Verify replays the compaction from the snapshot, as hydrate does.
    let report = r.verify(&acme).await?;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.ok.len(), all.len());
    // A superseded delta vanishes: the newest state does not need it.
    let gone = images[2].0;
    let path = object_store::path::Path::from(format!("{pfx}/orgs/acme/log/{gone:020}.json"));
    store
        .delete(&path)
        .await
        .map_err(|e| Error::store("delete", &path, e))?;
    let b = r.claim(&acme, "b", false).await?;
    let tmp = TempDir::new()?;
    let h = r.hydrate(&b, &tmp.path().join("db")).await?;
    assert_eq!(h.deltas, 3, "snapshot + compacted + 2 deltas");
    assert_eq!(h.snapshot.as_ref().map(|s| s.seq), Some(snap_seq));
    let got = std::fs::read(tmp.path().join("db")).map_err(|e| Error::io(tmp.path(), e))?;
    assert!(got == prev, "hydrate through a compacted delta differs");
    for (seq, image) in all.iter().filter(|(s, _)| *s != gone) {
        let dest = tmp.path().join(format!("at-{seq}"));
        let restored = r.restore(&acme, Some(*seq), &dest).await;
        if *seq > gone && *seq < compacted.seq {
            // Between the missing delta and the compacted one: a typed error.
            assert!(
                matches!(restored, Err(Error::ChainBroken { .. })),
                "{restored:?}"
            );
            continue;
        }
        restored?;
        let got = std::fs::read(&dest).map_err(|e| Error::io(&dest, e))?;
        assert!(got == *image, "restore at {seq} differs");
    }
    Ok(())
}
