//! Checks of a cloud store's conditional puts and of the I9 settlement on it, written once
//! and run on every server that passes the probe (`s3.rs` on moto, `azure.rs` on Azurite):
//! `cloud_tests!(store, #[ignore = "…"])` expands one `#[tokio::test]` per check.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use futures::stream::BoxStream;
use idem_replica::conformance::{self, unique_prefix as unique};
use idem_replica::fault::{Fault, FaultStore, Op};
use idem_replica::{Error, ErrorKind, LogEntry, OrgId, Replica, Settings};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, UpdateVersion,
};

/// What a check returns.
pub type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// One `#[tokio::test]` per check, on the store the first argument builds (evaluated per
/// test), with the attributes after it on every test.
macro_rules! cloud_tests {
    ($store:expr $(, #[$attr:meta])* $(,)?) => {
        cloud_tests!(@each [$store] [$(#[$attr])*] server_enforces_if_none_match_and_if_match_on_put concurrent_creates_on_one_path_have_exactly_one_winner probe_refuses_the_server_behind_a_wrapper_that_drops_the_condition a_resent_create_refused_for_its_own_write_is_settled_as_landed a_conflict_on_the_conditional_write_is_fenced_not_retried a_failed_put_whose_reread_finds_a_successor_is_fenced multipart_upload_round_trips);
    };
    (@each [$store:expr] $attrs:tt $($name:ident)*) => {
        $(cloud_tests!(@one [$store] $attrs $name);)*
    };
    (@one [$store:expr] [$(#[$attr:meta])*] $name:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $(#[$attr])*
        async fn $name() -> cloud::R {
            cloud::$name($store).await
        }
    };
}

pub async fn server_enforces_if_none_match_and_if_match_on_put(store: Arc<dyn ObjectStore>) -> R {
    let path = Path::from(format!("{}/obj", unique("cond")));
    let first = store
        .put_opts(
            &path,
            PutPayload::from_static(b"first"),
            PutMode::Create.into(),
        )
        .await?;
    let second = store
        .put_opts(
            &path,
            PutPayload::from_static(b"second"),
            PutMode::Create.into(),
        )
        .await;
    assert!(
        matches!(second, Err(object_store::Error::AlreadyExists { .. })),
        "create on an existing object was not refused: {second:?}"
    );
    assert_eq!(store.get(&path).await?.bytes().await?.as_ref(), b"first");

    // If-Match: a stale ETag is refused, the current one is accepted.
    let stale = UpdateVersion {
        e_tag: Some("\"0000000000000000\"".into()),
        version: None,
    };
    let res = store
        .put_opts(
            &path,
            PutPayload::from_static(b"x"),
            PutMode::Update(stale).into(),
        )
        .await;
    assert!(
        matches!(res, Err(object_store::Error::Precondition { .. })),
        "update with a stale etag was not refused: {res:?}"
    );
    let current = UpdateVersion::from(first);
    store
        .put_opts(
            &path,
            PutPayload::from_static(b"third"),
            PutMode::Update(current).into(),
        )
        .await?;
    assert_eq!(store.get(&path).await?.bytes().await?.as_ref(), b"third");
    Ok(())
}

pub async fn concurrent_creates_on_one_path_have_exactly_one_winner(
    store: Arc<dyn ObjectStore>,
) -> R {
    let base = unique("race");
    for round in 0..8 {
        let path = Path::from(format!("{base}/{round}"));
        let results = futures::future::join_all((0..16).map(|i| {
            let (store, path) = (store.clone(), path.clone());
            tokio::spawn(async move {
                let body = PutPayload::from(format!("writer-{i}").into_bytes());
                (i, store.put_opts(&path, body, PutMode::Create.into()).await)
            })
        }))
        .await;
        let mut winners = Vec::new();
        for joined in results {
            let (i, res) = joined?;
            match res {
                Ok(_) => winners.push(i),
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(e) => return Err(format!("writer {i}: unexpected error {e}").into()),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let stored = store.get(&path).await?.bytes().await?;
        assert_eq!(
            stored.as_ref(),
            format!("writer-{}", winners[0]).as_bytes(),
            "round {round}: the stored object is not the winner's"
        );
    }
    Ok(())
}

pub async fn probe_refuses_the_server_behind_a_wrapper_that_drops_the_condition(
    store: Arc<dyn ObjectStore>,
) -> R {
    let prefix = unique("probe");
    let wrapper = Arc::new(FaultStore::new(store.clone()));
    wrapper.ignore_create_condition(true);
    let res = Replica::open(wrapper.clone(), &prefix, Settings::default()).await;
    match res {
        Err(e @ Error::UnsafeStore { .. }) => assert_eq!(e.kind(), ErrorKind::Fatal),
        other => return Err(format!("unsafe store accepted: {other:?}").into()),
    }
    // A single dropped condition on the probe's second put is caught too.
    wrapper.ignore_create_condition(false);
    wrapper.inject(Op::Put, "/probe/", 2, Fault::IgnoreCreate);
    let res = Replica::open(wrapper.clone(), &prefix, Settings::default()).await;
    assert!(
        matches!(res, Err(Error::UnsafeStore { .. })),
        "probe missed a dropped condition: {res:?}"
    );
    // The same server with the condition intact is accepted.
    Replica::open(wrapper, &prefix, Settings::default()).await?;
    Replica::open(store, &prefix, Settings::default()).await?;
    Ok(())
}

/// Models an HTTP client that loses the response of a conditional put and sends it again:
/// the first create on a matching path reaches the server twice, and the caller sees the
/// second answer, a genuine refusal (S3 412, Azure 409/412) from the server for its own write.
#[derive(Debug)]
struct ResendOnce {
    inner: Arc<dyn ObjectStore>,
    path_contains: &'static str,
    armed: AtomicBool,
}

impl std::fmt::Display for ResendOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ResendOnce({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for ResendOnce {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let resend = opts.mode == PutMode::Create
            && location.as_ref().contains(self.path_contains)
            && self.armed.swap(false, Ordering::SeqCst);
        if !resend {
            return self.inner.put_opts(location, payload, opts).await;
        }
        self.inner
            .put_opts(location, payload.clone(), opts.clone())
            .await?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

fn snapshots(h: &[LogEntry]) -> Vec<(u64, u64)> {
    h.iter()
        .filter(|e| e.is_snapshot())
        .map(|e| (e.seq(), e.round()))
        .collect()
}

pub async fn a_resent_create_refused_for_its_own_write_is_settled_as_landed(
    store: Arc<dyn ObjectStore>,
) -> R {
    let resend = Arc::new(ResendOnce {
        inner: store,
        path_contains: "/log/",
        armed: AtomicBool::new(false),
    });
    let r = Replica::open(resend.clone(), &unique("resend"), Settings::default()).await?;
    let o = OrgId::new("acme")?;
    // The claim's create is resent: the server refuses it, the re-read finds our own entry.
    resend.armed.store(true, Ordering::SeqCst);
    let mut a = r.claim(&o, "a", false).await?;
    assert!(
        !resend.armed.load(Ordering::SeqCst),
        "the claim was not resent"
    );
    assert_eq!(r.history(&o).await?.len(), 1);
    // So is the ship's.
    resend.armed.store(true, Ordering::SeqCst);
    let s = r.ship(&mut a, conformance::test_snapshot(3)?).await?;
    assert!(
        !resend.armed.load(Ordering::SeqCst),
        "the ship was not resent"
    );
    assert_eq!(snapshots(&r.history(&o).await?), vec![(s.seq, a.round())]);
    assert!(a.unusable().is_none());
    // And the claim goes on shipping at the next slot.
    let s2 = r.ship(&mut a, conformance::test_snapshot(4)?).await?;
    assert_eq!(s2.seq, s.seq + 1);
    Ok(())
}

pub async fn a_conflict_on_the_conditional_write_is_fenced_not_retried(
    store: Arc<dyn ObjectStore>,
) -> R {
    let prefix = unique("conflict");
    let fa = Arc::new(FaultStore::new(store.clone()));
    let ra = Replica::open(fa.clone(), &prefix, Settings::default()).await?;
    let rb = Replica::open(store, &prefix, Settings::default()).await?;
    let o = OrgId::new("acme")?;
    let mut a = ra.claim(&o, "a", false).await?;
    ra.ship(&mut a, conformance::test_snapshot(1)?).await?;
    let b = rb.claim(&o, "b", true).await?;
    assert_eq!(b.seq(), a.next_seq(), "B took the slot A ships to next");

    // A's put reaches the server and is refused: the re-read finds B's claim, not ours.
    let puts = fa.calls(Op::Put);
    let res = ra.ship(&mut a, conformance::test_snapshot(2)?).await;
    match res {
        Err(Error::Fenced { ours, theirs, .. }) => {
            assert_eq!((ours, theirs), (a.round(), b.round()))
        }
        other => return Err(format!("A not fenced: {other:?}").into()),
    }
    assert_eq!(a.unusable(), Some("fenced"));
    // One segment, its manifest and one log create: a lost race is never retried.
    assert_eq!(fa.calls(Op::Put) - puts, 3);
    let h = rb.history(&o).await?;
    assert_eq!(
        h.last().map(|e| (e.seq(), e.round())),
        Some((b.seq(), b.round()))
    );
    assert_eq!(snapshots(&h).len(), 1);
    Ok(())
}

pub async fn a_failed_put_whose_reread_finds_a_successor_is_fenced(
    store: Arc<dyn ObjectStore>,
) -> R {
    let prefix = unique("unknown-conflict");
    let fa = Arc::new(FaultStore::new(store.clone()));
    let ra = Replica::open(fa.clone(), &prefix, Settings::default()).await?;
    let rb = Replica::open(store, &prefix, Settings::default()).await?;
    let o = OrgId::new("acme")?;
    let mut a = ra.claim(&o, "a", false).await?;
    let b = rb.claim(&o, "b", true).await?;
    // A's log put fails with an unknown outcome before reaching the server; the re-read finds B's
    // claim in the slot: lost the race (I9), no blind retry, no Unknown.
    fa.inject(Op::Put, "/log/", 1, Fault::FailBefore);
    let res = ra.ship(&mut a, conformance::test_snapshot(2)?).await;
    match res {
        Err(Error::Fenced { ours, theirs, .. }) => {
            assert_eq!((ours, theirs), (a.round(), b.round()))
        }
        other => return Err(format!("A not fenced: {other:?}").into()),
    }
    assert!(snapshots(&rb.history(&o).await?).is_empty());

    Ok(())
}

/// idem writes no multipart upload today; this records whether the server takes one (a part
/// of 5 MiB, S3's least for a part that is not the last, then a small one), for the table
/// of stores in docs/stores.md.
pub async fn multipart_upload_round_trips(store: Arc<dyn ObjectStore>) -> R {
    let path = Path::from(format!("{}/multipart", unique("multipart")));
    let first = vec![7u8; 5 * 1024 * 1024];
    let mut upload = store.put_multipart(&path).await?;
    upload.put_part(PutPayload::from(first.clone())).await?;
    upload.put_part(PutPayload::from_static(b"tail")).await?;
    upload.complete().await?;
    let got = store.get(&path).await?.bytes().await?;
    assert_eq!(got.len(), first.len() + 4);
    assert!(got.starts_with(&first) && got.ends_with(b"tail"));
    store.delete(&path).await?;
    Ok(())
}
