//! The conformance suite, written once over any [`ObjectStore`].
//!
//! Each function takes a fresh store, runs one behaviour under its own random prefix and
//! panics (via `assert!`) on a violated invariant; unexpected errors are returned. Run them
//! all with [`run_all`]; `replica/tests/` runs it on `InMemory`, `LocalFileSystem` and, when
//! [`S3_ENDPOINT_ENV`] is set, on an S3 API server ([`s3_store_from_env`]). Nothing here
//! assumes local paths in the store; hydration targets a temp directory on the local disk.

mod delta;

pub use delta::{
    broken_delta_chain_is_a_typed_error, compacted_delta_supersedes_the_chain,
    delta_chain_hydrates_and_restores_every_position, delta_needs_a_snapshot_and_is_fenced,
    retention_keeps_the_delta_chain, zombie_delta_is_fenced_and_collected,
};

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::sync::{Mutex as AsyncMutex, mpsc, oneshot};

use crate::fault::{Fault, FaultStore, Op};
use crate::layout::new_nonce;
use crate::{
    Clock, Error, FailPoint, Failpoints, LogEntry, ManualClock, OrgId, Replica, Retention,
    Settings, Snapshot,
};

/// A temp directory removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `<system temp>/idem-<nonce>`.
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be created.
    pub fn new() -> Result<TempDir, Error> {
        let p = std::env::temp_dir().join(format!("idem-{}", new_nonce()?));
        std::fs::create_dir_all(&p).map_err(|e| Error::io(&p, e))?;
        Ok(TempDir(p))
    }
    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A [`Failpoints`] that pauses the first hit of one point after [`PauseAt::arm`]: it reports
/// the hit on a channel and waits until [`PauseHandle::resume`] is sent. Orders interleavings without sleeps.
#[derive(Debug)]
pub struct PauseAt {
    point: FailPoint,
    armed: AtomicBool,
    reached: AsyncMutex<Option<oneshot::Sender<()>>>,
    resume: AsyncMutex<Option<oneshot::Receiver<()>>>,
}

/// Handles to drive a [`PauseAt`]: wait for the pause, then release it.
#[derive(Debug)]
pub struct PauseHandle {
    /// Fires when the operation reaches the point.
    pub reached: oneshot::Receiver<()>,
    /// Send to let the operation continue.
    pub resume: oneshot::Sender<()>,
}

impl PauseAt {
    /// A disarmed pause at `point`.
    pub fn new(point: FailPoint) -> Arc<PauseAt> {
        Arc::new(PauseAt {
            point,
            armed: AtomicBool::new(false),
            reached: AsyncMutex::new(None),
            resume: AsyncMutex::new(None),
        })
    }
    /// Arms it for the next hit and returns the handles.
    pub async fn arm(&self) -> PauseHandle {
        let (reached_tx, reached) = oneshot::channel();
        let (resume, resume_rx) = oneshot::channel();
        *self.reached.lock().await = Some(reached_tx);
        *self.resume.lock().await = Some(resume_rx);
        self.armed.store(true, Ordering::SeqCst);
        PauseHandle { reached, resume }
    }
}

#[async_trait::async_trait]
impl Failpoints for PauseAt {
    async fn hit(&self, point: FailPoint, _org: &OrgId) -> Result<(), String> {
        if point != self.point || !self.armed.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(tx) = self.reached.lock().await.take() {
            let _ = tx.send(());
        }
        let rx = self.resume.lock().await.take();
        if let Some(rx) = rx {
            let _ = rx.await;
        }
        Ok(())
    }
}

/// Names the S3 endpoint of a test server (`scripts/s3-server` sets it); unset = no S3 tests.
pub const S3_ENDPOINT_ENV: &str = "IDEM_S3_ENDPOINT";
/// Names the bucket on that server (default `idem-test`).
pub const S3_BUCKET_ENV: &str = "IDEM_S3_BUCKET";

/// The S3-compatible test server named by [`S3_ENDPOINT_ENV`], or `None` when it is unset.
///
/// Built the way a user configures one: `AmazonS3Builder` with the endpoint, path-style
/// addressing, plain HTTP allowed, region `us-east-1` and static credentials. Conditional
/// puts are object_store's default (`If-None-Match: *` for `PutMode::Create`). Each
/// conformance function works under its own random prefix, so one bucket serves them all.
///
/// # Errors
/// [`Error::Store`] when the builder refuses the settings.
pub fn s3_store_from_env() -> Result<Option<Arc<dyn ObjectStore>>, Error> {
    let Ok(endpoint) = std::env::var(S3_ENDPOINT_ENV) else {
        return Ok(None);
    };
    let bucket = std::env::var(S3_BUCKET_ENV).unwrap_or_else(|_| "idem-test".to_owned());
    let store = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(&bucket)
        .with_endpoint(&endpoint)
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .build()
        .map_err(|source| Error::Store {
            op: "build",
            path: format!("s3://{bucket} at {endpoint}"),
            source,
        })?;
    Ok(Some(Arc::new(store)))
}

fn prefix() -> Result<String, Error> {
    Ok(format!("conf-{}", &new_nonce()?[..12]))
}

fn org(s: &str) -> OrgId {
    match OrgId::new(s) {
        Ok(o) => o,
        Err(e) => panic!("test org id {s:?}: {e}"),
    }
}

/// A small SQLite image with `rows` rows in table `t`, commit counter = `rows`.
///
/// # Errors
/// [`Error::Sqlite`].
pub fn test_snapshot(rows: u64) -> Result<Snapshot, Error> {
    let sql = |source| Error::Sqlite {
        op: "building a test snapshot",
        source,
    };
    let conn = rusqlite::Connection::open_in_memory().map_err(sql)?;
    conn.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
        .map_err(sql)?;
    for i in 0..rows {
        conn.execute(
            "INSERT INTO t(id, v) VALUES (?1, ?2)",
            rusqlite::params![i as i64, format!("row-{i}")],
        )
        .map_err(sql)?;
    }
    Snapshot::take(&conn, |c| {
        c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
    })
}

fn rows_in(path: &std::path::Path) -> Result<u64, Error> {
    let sql = |source| Error::Sqlite {
        op: "reading a hydrated db",
        source,
    };
    let conn = rusqlite::Connection::open(path).map_err(sql)?;
    let n: i64 = conn
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .map_err(sql)?;
    Ok(n as u64)
}

async fn open(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<Replica, Error> {
    Replica::open(store, prefix, Settings::default()).await
}

/// Runs every conformance test, each on a fresh store from `make`.
///
/// # Errors
/// The first unexpected error.
pub async fn run_all(make: impl Fn() -> Arc<dyn ObjectStore>) -> Result<(), Error> {
    probe_accepts_store(make()).await?;
    claim_rounds_strictly_increase(make()).await?;
    concurrent_claims_get_distinct_rounds(make()).await?;
    overlapping_writers_old_ship_is_fenced(make()).await?;
    zombie_after_retention_is_fenced(make()).await?;
    landed_but_error_put_is_settled_by_reread(make()).await?;
    faults_at_every_put_site(make()).await?;
    corrupt_blob_is_refused_and_nothing_installed(make()).await?;
    release_lets_next_claim_through(make()).await?;
    lease_respected_unless_force(make()).await?;
    org_isolation(make()).await?;
    retention_keeps_newest(make()).await?;
    restore_and_verify(make()).await?;
    unknown_entry_format_is_refused(make()).await?;
    snapshot_under_concurrent_writes(make()).await?;
    delta_chain_hydrates_and_restores_every_position(make()).await?;
    broken_delta_chain_is_a_typed_error(make()).await?;
    delta_needs_a_snapshot_and_is_fenced(make()).await?;
    retention_keeps_the_delta_chain(make()).await?;
    zombie_delta_is_fenced_and_collected(make()).await?;
    compacted_delta_supersedes_the_chain(make()).await?;
    Ok(())
}

/// The store honours create-only puts, and a store that ignores them is refused.
///
/// # Errors
/// Unexpected failures.
pub async fn probe_accepts_store(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    let p = prefix()?;
    open(store.clone(), &p).await?;
    let unsafe_store = Arc::new(FaultStore::new(store));
    unsafe_store.ignore_create_condition(true);
    let r = open(unsafe_store, &p).await;
    assert!(
        matches!(r, Err(Error::UnsafeStore { .. })),
        "unsafe store accepted: {r:?}"
    );
    Ok(())
}

/// Claims by successive writers get rounds 1, 2, 3…; the log is linear.
///
/// # Errors
/// Unexpected failures.
pub async fn claim_rounds_strictly_increase(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    let r = open(store, &prefix()?).await?;
    let o = org("acme");
    let mut last = 0;
    for i in 0..4 {
        let c = r.claim(&o, &format!("w{i}"), true).await?;
        assert!(c.round > last, "round {} after {last}", c.round);
        last = c.round;
    }
    let h = r.history(&o).await?;
    assert_eq!(
        h.iter().map(LogEntry::seq).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    Ok(())
}

/// Concurrent claimers get distinct, increasing rounds and only the newest can ship.
///
/// # Errors
/// Unexpected failures.
pub async fn concurrent_claims_get_distinct_rounds(
    store: Arc<dyn ObjectStore>,
) -> Result<(), Error> {
    let settings = Settings {
        claim_retries: 64,
        ..Settings::default()
    };
    let r = Replica::open(store, &prefix()?, settings).await?;
    let o = org("acme");
    let claims = futures::future::join_all((0..4).map(|i| {
        let (r, o) = (r.clone(), o.clone());
        async move { r.claim(&o, &format!("w{i}"), true).await }
    }))
    .await;
    let mut claims: Vec<_> = claims.into_iter().collect::<Result<_, _>>()?;
    claims.sort_by_key(|c| c.round);
    let rounds: Vec<u64> = claims.iter().map(|c| c.round).collect();
    let mut dedup = rounds.clone();
    dedup.dedup();
    assert_eq!(rounds, dedup, "duplicate rounds");
    let n = claims.len();
    for (i, c) in claims.iter_mut().enumerate() {
        let res = r.ship(c, test_snapshot(3)?).await;
        if i + 1 == n {
            assert!(res.is_ok(), "newest claim could not ship: {res:?}");
        } else {
            assert!(
                matches!(res, Err(Error::Fenced { .. })),
                "older claim shipped: {res:?}"
            );
        }
    }
    Ok(())
}

/// Rolling deploy: the old writer's ship is fenced; one linear history.
///
/// # Errors
/// Unexpected failures.
pub async fn overlapping_writers_old_ship_is_fenced(
    store: Arc<dyn ObjectStore>,
) -> Result<(), Error> {
    let r = open(store, &prefix()?).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    r.ship(&mut a, test_snapshot(1)?).await?;
    let mut b = r.claim(&o, "b", true).await?;
    let res = r.ship(&mut a, test_snapshot(2)?).await;
    match res {
        Err(Error::Fenced { ours, theirs, .. }) => assert_eq!((ours, theirs), (a.round, b.round)),
        other => panic!("old writer not fenced: {other:?}"),
    }
    assert!(matches!(
        r.ship(&mut a, test_snapshot(2)?).await,
        Err(Error::ClaimUnusable { .. })
    ));
    let s = r.ship(&mut b, test_snapshot(5)?).await?;
    let h = r.history(&o).await?;
    let seqs: Vec<u64> = h.iter().map(LogEntry::seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "history not linear"
    );
    let last_snap = h
        .iter()
        .rev()
        .find(|e| matches!(e, LogEntry::Snapshot { .. }));
    assert_eq!(
        last_snap.map(|e| (e.seq(), e.round())),
        Some((s.seq, b.round))
    );
    Ok(())
}

/// A zombie paused after uploading resumes after its successor shipped and retention ran:
/// retention kept the successor's claim in the zombie's slot (claims are never deleted), so
/// the zombie's create collides and it is fenced; hydrate installs the successor's snapshot
/// (I7, I11).
///
/// # Errors
/// Unexpected failures.
pub async fn zombie_after_retention_is_fenced(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    let p = prefix()?;
    let pause = PauseAt::new(FailPoint::ShipAfterUpload);
    let clock: Arc<dyn Clock> = Arc::new(crate::SystemClock);
    let za = Replica::open_with(
        store.clone(),
        &p,
        Settings::default(),
        clock,
        Some(pause.clone()),
    )
    .await?;
    let rb = open(store, &p).await?;
    let o = org("acme");
    let mut a = za.claim(&o, "a", false).await?;
    za.ship(&mut a, test_snapshot(1)?).await?;
    let handle = pause.arm().await;
    let zombie = {
        let (za, mut a) = (za.clone(), a.clone());
        tokio::spawn(async move { za.ship(&mut a, test_snapshot(2)?).await })
    };
    handle.reached.await.map_err(|_| Error::InvalidSettings {
        reason: "zombie never paused".into(),
    })?;
    let mut b = rb.claim(&o, "b", true).await?;
    assert_eq!(b.seq, a.next_seq(), "successor claimed the zombie's slot");
    let s1 = rb.ship(&mut b, test_snapshot(3)?).await?;
    let s2 = rb.ship(&mut b, test_snapshot(4)?).await?;
    let rep = rb
        .retain(
            &o,
            &Retention {
                keep_snapshots: 1,
                keep_ms: 0,
            },
        )
        .await?;
    assert!(
        !rep.deleted_entries.contains(&b.seq),
        "retention freed the claim in the zombie's slot: {rep:?}"
    );
    assert!(
        rep.deleted_entries.contains(&s1.seq),
        "retention deleted nothing: {rep:?}"
    );
    assert!(!rep.deleted_entries.contains(&s2.seq));
    let _ = handle.resume.send(());
    let res = zombie.await.map_err(|source| Error::Task {
        op: "zombie",
        source,
    })?;
    assert!(
        matches!(res, Err(Error::Fenced { .. })),
        "zombie not fenced: {res:?}"
    );
    let tmp = TempDir::new()?;
    let c = rb.claim(&o, "c", true).await?;
    let h = rb.hydrate(&c, &tmp.path().join("db")).await?;
    assert_eq!(
        h.snapshot.map(|s| s.seq),
        Some(s2.seq),
        "hydrate did not pick the successor's snapshot"
    );
    assert_eq!(rows_in(&tmp.path().join("db"))?, 4);
    Ok(())
}

/// A put that lands but returns an error is settled by the I9 re-read; a put the store keeps
/// refusing (read back empty after the one retry) is `StoreRefused`, retryable, and the claim
/// ships on; neither is a false success or a lost publish.
///
/// # Errors
/// Unexpected failures.
pub async fn landed_but_error_put_is_settled_by_reread(
    store: Arc<dyn ObjectStore>,
) -> Result<(), Error> {
    let fs = Arc::new(FaultStore::new(store));
    let r = open(fs.clone(), &prefix()?).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    fs.inject(Op::Put, "/log/", 1, Fault::FailAfter);
    let s = r.ship(&mut a, test_snapshot(2)?).await?;
    let h = r.history(&o).await?;
    assert_eq!(
        h.iter()
            .filter(|e| matches!(e, LogEntry::Snapshot { .. }))
            .count(),
        1
    );
    fs.inject(Op::Put, "/log/", 1, Fault::FailBefore);
    let s2 = r.ship(&mut a, test_snapshot(3)?).await?;
    assert_eq!(s2.seq, s.seq + 1);
    fs.inject_times(Op::Put, "/log/", 1, 2, Fault::FailBefore);
    // Refused twice and read back empty twice: the store refused the write. That is named
    // as such (not an unknown outcome, not fencing), and the claim stays usable.
    let res = r.ship(&mut a, test_snapshot(4)?).await;
    assert!(matches!(res, Err(Error::StoreRefused { .. })), "{res:?}");
    assert!(res.as_ref().is_err_and(Error::is_retryable), "{res:?}");
    assert!(a.unusable().is_none());
    assert!(r.read_entry(&o, s2.seq + 1).await?.is_none());
    let s3 = r.ship(&mut a, test_snapshot(4)?).await?;
    assert_eq!(s3.seq, s2.seq + 1);
    // A claim the store refuses is named so, not a lost race after every retry.
    fs.inject_times(Op::Put, "/log/", 1, 2, Fault::FailBefore);
    let refused = r.claim(&o, "c", true).await;
    assert!(
        matches!(refused, Err(Error::StoreRefused { .. })),
        "{refused:?}"
    );
    fs.clear();
    // A claim settled through a landed-but-error put.
    fs.inject(Op::Put, "/log/", 1, Fault::FailAfter);
    let b = r.claim(&o, "b", true).await?;
    assert_eq!(r.history(&o).await?.last().map(LogEntry::seq), Some(b.seq));
    Ok(())
}

/// Fail every put site (blob, log entry, lease) before and after it lands: an `Ok` ship is
/// always published and hydrates; an error never leaves a snapshot entry the caller was
/// told failed unless the claim was marked unusable.
///
/// # Errors
/// Unexpected failures.
pub async fn faults_at_every_put_site(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    let fs = Arc::new(FaultStore::new(store));
    let clock = Arc::new(ManualClock::new(1_000_000));
    let settings = Settings {
        lease_ms: 10,
        ..Settings::default()
    };
    for site in ["/snap/", "/log/", "lease.json"] {
        for fault in [Fault::FailBefore, Fault::FailAfter] {
            let r = Replica::open_with(
                fs.clone(),
                &prefix()?,
                settings.clone(),
                clock.clone(),
                None,
            )
            .await?;
            let o = org("acme");
            let mut a = r.claim(&o, "a", false).await?;
            r.ship(&mut a, test_snapshot(1)?).await?;
            clock.advance(100); // lease renewal due: the ship also puts lease.json
            fs.inject(Op::Put, site, 1, fault);
            let res = r.ship(&mut a, test_snapshot(2)?).await;
            fs.clear();
            let snaps: Vec<LogEntry> = r
                .history(&o)
                .await?
                .into_iter()
                .filter(|e| matches!(e, LogEntry::Snapshot { .. }))
                .collect();
            match &res {
                Ok(s) => {
                    assert_eq!(
                        snaps.last().map(LogEntry::seq),
                        Some(s.seq),
                        "{site} {fault:?}: false success"
                    );
                    let c = r.claim(&o, "check", true).await?;
                    let tmp = TempDir::new()?;
                    let h = r.hydrate(&c, &tmp.path().join("db")).await?;
                    assert_eq!(h.commit, 2, "{site} {fault:?}: lost publish");
                }
                Err(e) => {
                    assert!(e.is_retryable() || e.is_fenced(), "{site} {fault:?}: {e}");
                    if a.unusable().is_none() {
                        assert_eq!(
                            snaps.len(),
                            1,
                            "{site} {fault:?}: failed ship left an entry"
                        );
                    }
                }
            }
            if site == "lease.json" {
                fs.inject(Op::Put, site, 1, fault);
                let claimed = r.claim(&o, "z", true).await;
                fs.clear();
                assert!(
                    claimed.is_ok(),
                    "lease write failure must not fail a landed claim"
                );
            }
        }
    }
    Ok(())
}

/// Flipped byte, truncation, deletion of the latest blob: typed error, nothing installed,
/// no fall back to the older snapshot (I10).
///
/// # Errors
/// Unexpected failures.
pub async fn corrupt_blob_is_refused_and_nothing_installed(
    store: Arc<dyn ObjectStore>,
) -> Result<(), Error> {
    let r = open(store.clone(), &prefix()?).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    r.ship(&mut a, test_snapshot(5)?).await?;
    let newest = r.ship(&mut a, test_snapshot(9)?).await?;
    let blob = Path::from(newest.blob.as_str());
    let good = store
        .get(&blob)
        .await
        .map_err(|e| Error::store("get", &blob, e))?
        .bytes()
        .await
        .map_err(|e| Error::store("get", &blob, e))?;
    let c = r.claim(&o, "b", true).await?;
    let tmp = TempDir::new()?;
    let dest = tmp.path().join("acme.db");
    let mut flipped = good.to_vec();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    let truncated = good.slice(..good.len() / 2).to_vec();
    for (what, body) in [
        ("flipped", Some(flipped)),
        ("truncated", Some(truncated)),
        ("deleted", None),
    ] {
        match body {
            Some(b) => store.put(&blob, PutPayload::from(b)).await.map(|_| ()),
            None => store.delete(&blob).await,
        }
        .map_err(|e| Error::store("put", &blob, e))?;
        let res = r.hydrate(&c, &dest).await;
        match (what, &res) {
            ("deleted", Err(Error::MissingObject { .. }))
            | ("flipped" | "truncated", Err(Error::Corrupt { .. })) => {}
            _ => panic!("{what}: expected a typed error, got {res:?}"),
        }
        assert!(
            res.as_ref()
                .is_err_and(|e| e.kind() == crate::ErrorKind::Corrupt)
        );
        assert!(!dest.exists(), "{what}: something was installed");
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .map_err(|e| Error::io(tmp.path(), e))?
            .collect();
        assert!(left.is_empty(), "{what}: temp files left behind");
        let v = r.verify(&o).await?;
        assert!(
            v.failed.iter().any(|(s, _)| *s == newest.seq),
            "{what}: verify missed it"
        );
    }
    Ok(())
}

/// A Release entry lets the next claim through at once, despite a live lease.
///
/// # Errors
/// Unexpected failures.
pub async fn release_lets_next_claim_through(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let r = Replica::open_with(store, &prefix()?, Settings::default(), clock, None).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    r.ship(&mut a, test_snapshot(3)?).await?;
    assert!(matches!(
        r.claim(&o, "b", false).await,
        Err(Error::LeaseHeld { .. })
    ));
    r.release(&mut a).await?;
    assert!(matches!(
        r.ship(&mut a, test_snapshot(4)?).await,
        Err(Error::ClaimUnusable { .. })
    ));
    let b = r.claim(&o, "b", false).await?;
    assert!(b.round > a.round);
    let tmp = TempDir::new()?;
    assert_eq!(r.hydrate(&b, &tmp.path().join("db")).await?.commit, 3);
    Ok(())
}

/// A live lease blocks other writers unless `force`; an expired one does not.
///
/// # Errors
/// Unexpected failures.
pub async fn lease_respected_unless_force(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let settings = Settings {
        lease_ms: 30_000,
        ..Settings::default()
    };
    let r = Replica::open_with(store, &prefix()?, settings, clock.clone(), None).await?;
    let o = org("acme");
    let a = r.claim(&o, "a", false).await?;
    match r.claim(&o, "b", false).await {
        Err(Error::LeaseHeld {
            holder,
            expires_at_ms,
            ..
        }) => assert_eq!((holder.as_str(), expires_at_ms), ("a", 1_030_000)),
        other => panic!("lease ignored: {other:?}"),
    }
    let b = r.claim(&o, "b", true).await?;
    assert!(b.round > a.round);
    assert_eq!(r.lease(&o).await?.map(|l| l.writer), Some("b".to_string()));
    clock.advance(30_001);
    let c = r.claim(&o, "c", false).await?;
    assert!(c.round > b.round);
    Ok(())
}

/// `acme` never sees `acme2`'s objects (I12).
///
/// # Errors
/// Unexpected failures.
pub async fn org_isolation(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    let r = open(store, &prefix()?).await?;
    let (acme, acme2) = (org("acme"), org("acme2"));
    let mut c2 = r.claim(&acme2, "w", false).await?;
    r.ship(&mut c2, test_snapshot(7)?).await?;
    assert!(r.history(&acme).await?.is_empty());
    assert!(r.lease(&acme).await?.is_none());
    let c = r.claim(&acme, "w", false).await?;
    assert_eq!(c.round, 1);
    let tmp = TempDir::new()?;
    let h = r.hydrate(&c, &tmp.path().join("db")).await?;
    assert_eq!(
        h,
        crate::Hydrated {
            snapshot: None,
            commit: 0,
            position: None,
            deltas: 0,
        }
    );
    assert!(!tmp.path().join("db").exists());
    r.retain(
        &acme,
        &Retention {
            keep_snapshots: 1,
            keep_ms: 0,
        },
    )
    .await?;
    assert_eq!(r.history(&acme2).await?.len(), 2);
    assert_eq!(r.orgs().await?, vec![acme, acme2]);
    Ok(())
}

/// Retention deletes old snapshots and orphans but never the newest or anything after it.
///
/// # Errors
/// Unexpected failures.
pub async fn retention_keeps_newest(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let r = Replica::open_with(
        store.clone(),
        &prefix()?,
        Settings::default(),
        clock.clone(),
        None,
    )
    .await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    let mut shipped = Vec::new();
    for i in 0..4 {
        shipped.push(r.ship(&mut a, test_snapshot(i + 1)?).await?);
        clock.advance(1000);
    }
    // Young snapshots survive an age policy.
    let rep = r
        .retain(
            &o,
            &Retention {
                keep_snapshots: 1,
                keep_ms: 10_000,
            },
        )
        .await?;
    assert_eq!(rep.kept_snapshots, 4);
    clock.advance(60_000);
    let rep = r
        .retain(
            &o,
            &Retention {
                keep_snapshots: 2,
                keep_ms: 10_000,
            },
        )
        .await?;
    assert_eq!(rep.kept_snapshots, 2);
    let h = r.history(&o).await?;
    let seqs: Vec<u64> = h.iter().map(LogEntry::seq).collect();
    // The claim stays: retention never frees a slot a zombie could publish into.
    assert_eq!(seqs, vec![a.seq, shipped[2].seq, shipped[3].seq]);
    for s in &shipped[..2] {
        let gone = store.head(&Path::from(s.blob.as_str())).await;
        assert!(
            matches!(gone, Err(object_store::Error::NotFound { .. })),
            "blob kept: {}",
            s.blob
        );
    }
    let kept = store.head(&Path::from(shipped[3].blob.as_str())).await;
    assert!(kept.is_ok(), "newest blob deleted");
    // Even keep_snapshots = 0 keeps the newest.
    r.retain(
        &o,
        &Retention {
            keep_snapshots: 0,
            keep_ms: 0,
        },
    )
    .await?;
    let tmp = TempDir::new()?;
    let c = r.claim(&o, "b", true).await?;
    assert_eq!(r.hydrate(&c, &tmp.path().join("db")).await?.commit, 4);
    Ok(())
}

/// Restore picks any published snapshot by seq; verify checks them all.
///
/// # Errors
/// Unexpected failures.
pub async fn restore_and_verify(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    let r = open(store, &prefix()?).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    let s1 = r.ship(&mut a, test_snapshot(2)?).await?;
    let s2 = r.ship(&mut a, test_snapshot(6)?).await?;
    let tmp = TempDir::new()?;
    let dest = tmp.path().join("db");
    assert_eq!(r.restore(&o, Some(s1.seq), &dest).await?.commit, 2);
    assert_eq!(rows_in(&dest)?, 2);
    assert_eq!(r.restore(&o, None, &dest).await?.snapshot, Some(s2.clone()));
    assert_eq!(rows_in(&dest)?, 6);
    assert!(matches!(
        r.restore(&o, Some(a.seq), &dest).await,
        Err(Error::NoSuchSnapshot { .. })
    ));
    let v = r.verify(&o).await?;
    assert_eq!(v.ok, vec![s1.seq, s2.seq]);
    assert!(v.failed.is_empty());
    Ok(())
}

/// An entry of an unknown version or kind is refused, not skipped.
///
/// # Errors
/// Unexpected failures.
pub async fn unknown_entry_format_is_refused(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    let p = prefix()?;
    let r = open(store.clone(), &p).await?;
    let o = org("acme");
    let a = r.claim(&o, "a", false).await?;
    let path = Path::from(format!("{p}/orgs/acme/log/{:020}.json", a.seq + 1));
    let body = format!(r#"{{"v":2,"kind":"delta","seq":{}}}"#, a.seq + 1);
    store
        .put(&path, PutPayload::from(body.into_bytes()))
        .await
        .map_err(|e| Error::store("put", &path, e))?;
    assert!(matches!(
        r.history(&o).await,
        Err(Error::UnknownFormat { .. })
    ));
    assert!(matches!(
        r.claim(&o, "b", true).await,
        Err(Error::UnknownFormat { .. })
    ));
    Ok(())
}

/// A snapshot taken while another connection writes continuously passes `integrity_check`
/// and holds every row committed before it began, and exactly its commit counter's rows.
///
/// # Errors
/// Unexpected failures.
pub async fn snapshot_under_concurrent_writes(store: Arc<dyn ObjectStore>) -> Result<(), Error> {
    let r = open(store, &prefix()?).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    let tmp = TempDir::new()?;
    let db = tmp.path().join("live.db");
    let sql = |source| Error::Sqlite {
        op: "concurrent-writes test",
        source,
    };
    let setup = rusqlite::Connection::open(&db).map_err(sql)?;
    setup
        .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);")
        .map_err(sql)?;
    drop(setup);
    // Row i is counted in `begun` before its INSERT and in `committed` after it returns: a
    // snapshot taken between two reads of them holds at least the first `committed` and at
    // most the second `begun` rows (the commit lands before `committed` is raised).
    let begun = Arc::new(AtomicU64::new(0));
    let committed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (started_tx, mut started) = mpsc::channel::<()>(1);
    let writer = {
        let (db, begun, committed, stop) =
            (db.clone(), begun.clone(), committed.clone(), stop.clone());
        std::thread::spawn(move || -> Result<(), Error> {
            let conn = rusqlite::Connection::open(&db).map_err(sql)?;
            conn.busy_timeout(std::time::Duration::from_secs(10))
                .map_err(sql)?;
            let mut i: u64 = 0;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                begun.store(i, Ordering::SeqCst);
                conn.execute(
                    "INSERT INTO t(id, v) VALUES (?1, zeroblob(512))",
                    [i as i64],
                )
                .map_err(sql)?;
                committed.store(i, Ordering::SeqCst);
                if i == 200 {
                    let _ = started_tx.blocking_send(());
                }
            }
            Ok(())
        })
    };
    let _ = started.recv().await;
    for _ in 0..3 {
        let before = committed.load(Ordering::SeqCst);
        let (db2, b2) = (db.clone(), begun.clone());
        let snap = tokio::task::spawn_blocking(move || {
            let conn = rusqlite::Connection::open(&db2).map_err(sql)?;
            let s = Snapshot::take(&conn, |c| {
                c.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
                    .map(|n| n as u64)
            })?;
            Ok::<_, Error>((s, b2.load(Ordering::SeqCst)))
        })
        .await
        .map_err(|source| Error::Task {
            op: "snapshot",
            source,
        })??;
        let (snap, after) = snap;
        assert!(
            snap.commit() >= before && snap.commit() <= after,
            "{before} <= {} <= {after}",
            snap.commit()
        );
        let shipped = r.ship(&mut a, snap).await?;
        let dest = tmp.path().join("hydrated.db");
        let h = r.restore(&o, Some(shipped.seq), &dest).await?;
        let conn = rusqlite::Connection::open(&dest).map_err(sql)?;
        crate::snapshot::sqlite_check(&conn, "integrity_check", "hydrated")?;
        let (n, max): (i64, i64) = conn
            .query_row("SELECT count(*), coalesce(max(id), 0) FROM t", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .map_err(sql)?;
        assert_eq!(
            (n as u64, max as u64),
            (h.commit, h.commit),
            "snapshot rows vs its commit counter"
        );
        assert!(
            h.commit >= before,
            "snapshot lost rows committed before it began"
        );
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().map_err(|_| Error::InvalidSettings {
        reason: "writer thread panicked".into(),
    })??;
    Ok(())
}
