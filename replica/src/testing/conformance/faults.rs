//! Store faults and damage: puts that fail or land but fail (I9), damaged blobs and
//! entries of unknown formats (I10).

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::{CaseResult, open, org, prefix, test_snapshot};
use crate::testing::fault::{Fault, FaultStore, Op};
use crate::{Error, LogEntry, ManualClock, Replica, Settings};

/// A put that lands but returns an error is settled by the I9 re-read; a put the store keeps
/// refusing (read back empty after the one retry) is `StoreRefused`, retryable, and the claim
/// ships on; neither is a false success or a lost publish.
pub(super) async fn landed_but_error_put_is_settled_by_reread(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let fs = Arc::new(FaultStore::new(store));
    let r = open(fs.clone(), &prefix()?).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    fs.inject(Op::Put, "/log/", 1, Fault::FailAfter);
    let s = r.ship(&mut a, test_snapshot(2)?).await?;
    let h = r.history(&o).await?;
    assert_eq!(h.iter().filter(|e| e.is_snapshot()).count(), 1);
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
    assert!(r.inner.log.read_entry(&o, s2.seq + 1).await?.is_none());
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
    assert_eq!(
        r.history(&o).await?.last().map(LogEntry::seq),
        Some(b.seq())
    );
    Ok(())
}

/// Fail every put site (blob, log entry, lease) before and after it lands: an `Ok` ship is
/// always published and hydrates; an error never leaves a snapshot entry the caller was
/// told failed unless the claim was marked unusable.
pub(super) async fn faults_at_every_put_site(store: Arc<dyn ObjectStore>) -> CaseResult {
    let fs = Arc::new(FaultStore::new(store));
    let clock = Arc::new(ManualClock::new(1_000_000));
    let settings = Settings {
        lease_ms: 1_000,
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
            clock.advance(1_000); // lease renewal due: the ship also puts lease.json
            fs.inject(Op::Put, site, 1, fault);
            let res = r.ship(&mut a, test_snapshot(2)?).await;
            fs.clear();
            let snaps: Vec<LogEntry> = r
                .history(&o)
                .await?
                .into_iter()
                .filter(|e| e.is_snapshot())
                .collect();
            match &res {
                Ok(s) => {
                    assert_eq!(
                        snaps.last().map(LogEntry::seq),
                        Some(s.seq),
                        "{site} {fault:?}: false success"
                    );
                    let mut c = r.claim(&o, "check", true).await?;
                    let tmp = tempfile::tempdir()?;
                    let h = r.hydrate(&mut c, &tmp.path().join("db")).await?;
                    assert_eq!(h.commit, 2, "{site} {fault:?}: lost publish");
                }
                Err(e) => {
                    assert!(
                        e.is_retryable() || e.is_claim_lost(),
                        "{site} {fault:?}: {e}"
                    );
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
pub(super) async fn corrupt_blob_is_refused_and_nothing_installed(
    store: Arc<dyn ObjectStore>,
) -> CaseResult {
    let r = open(store.clone(), &prefix()?).await?;
    let o = org("acme");
    let mut a = r.claim(&o, "a", false).await?;
    r.ship(&mut a, test_snapshot(5)?).await?;
    let newest = r.ship(&mut a, test_snapshot(9)?).await?;
    let blob = Path::from(newest.blob.as_str());
    let good = store.get(&blob).await?.bytes().await?;
    let mut c = r.claim(&o, "b", true).await?;
    let tmp = tempfile::tempdir()?;
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
        }?;
        let res = r.hydrate(&mut c, &dest).await;
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
        let left: Vec<_> = std::fs::read_dir(tmp.path())?.collect();
        assert!(left.is_empty(), "{what}: temp files left behind");
        let v = r.verify(&o).await?;
        assert!(
            v.failed.iter().any(|(s, _)| *s == newest.seq),
            "{what}: verify missed it"
        );
    }
    Ok(())
}

/// An entry of an unknown version or kind is refused, not skipped.
pub(super) async fn unknown_entry_format_is_refused(store: Arc<dyn ObjectStore>) -> CaseResult {
    let p = prefix()?;
    let r = open(store.clone(), &p).await?;
    let o = org("acme");
    let a = r.claim(&o, "a", false).await?;
    let path = Path::from(format!("{p}/orgs/acme/log/{:020}.json", a.seq() + 1));
    let body = format!(r#"{{"v":99,"kind":"delta","seq":{}}}"#, a.seq() + 1);
    store
        .put(&path, PutPayload::from(body.into_bytes()))
        .await?;
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
