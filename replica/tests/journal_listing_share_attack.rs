//! An attack on shared run listings (commit 705cea6, `docs/design.md` 3g "The walk"):
//! `journal/coalesce.rs` (`RunListings`: a walk reads a listing whose LIST began after the
//! walk began; listings of one run one at a time; a walk entering lower lists from there),
//! `journal/headers.rs` (`SealedListings`: a sealed run's gap-free part up to its first seal
//! serves every later walk entering in it) and `Listed::sections_of` (a batch's sections by
//! org). Every schedule is forced at exact store requests (a LIST held at a gate, a hook run
//! just before one GET), never ordered by sleeping, and every walk on the handle under attack
//! is compared with the same walk on a fresh handle that lists for itself.

#![allow(clippy::unwrap_used, clippy::too_many_lines, missing_docs)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use idem_replica::journal::*;
use idem_replica::{Delta, Error, OrgId, Replica, Settings};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result as OsResult,
};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn inst(n: u64) -> String {
    format!("{n:032x}")
}

fn run_of(n: u64) -> RunName {
    RunName::new(&inst(n), 1).unwrap()
}

fn org(s: &str) -> OrgId {
    OrgId::new(s).unwrap()
}

fn pages(commit: u64) -> Delta {
    let fill = commit as u8;
    Delta::new(
        4096,
        3,
        BTreeMap::from([(2, vec![fill; 4096]), (3, vec![fill ^ 0x5a; 4096])]),
        commit,
    )
    .unwrap()
}

fn section(o: &OrgId, via: Via, commit: u64) -> SectionInput {
    SectionInput {
        org: o.clone(),
        via,
        base: Base {
            seq: 1,
            checksum: "base".into(),
        },
        checksum: format!("after-{commit}"),
        pages: pages(commit),
        released: false,
    }
}

fn claim(seq: u64) -> Via {
    Via::Claim { seq }
}

fn tenure(round: u64, claim: u64) -> WalkTenure {
    WalkTenure {
        round,
        via: Via::Claim { seq: claim },
    }
}

async fn open(store: Arc<dyn ObjectStore>) -> Replica {
    Replica::open(store, "", Settings::default()).await.unwrap()
}

fn jdir(run: &RunName) -> String {
    format!("journals/{run}")
}

fn jpath(run: &RunName, slot: u64) -> Path {
    Path::from(format!("journals/{run}/{slot:020}.jnl"))
}

/// A header-only journal object (a seal or an exclusion) exactly as the format encodes it.
fn encode(header: &JournalHeader) -> Vec<u8> {
    let json = serde_json::to_vec(header).unwrap();
    let mut out = Vec::new();
    out.extend_from_slice(&JOURNAL_MAGIC);
    out.extend_from_slice(&JOURNAL_VERSION.to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&json));
    out.extend_from_slice(&json);
    out
}

/// Creates a crafted fence create-only, as its placer would.
async fn put_object(store: &Arc<dyn ObjectStore>, header: &JournalHeader) {
    store
        .put_opts(
            &jpath(&header.run, header.slot),
            PutPayload::from(encode(header)),
            object_store::PutMode::Create.into(),
        )
        .await
        .unwrap();
}

fn exclusion(o: &OrgId, claim: u64, round: u64, continued: &RunName, from: u64) -> JournalObject {
    JournalObject::Exclusion(Exclusion {
        org: o.to_string(),
        claim,
        round,
        continued: continued.clone(),
        from,
        by: "x".into(),
    })
}

fn adopt_seal(continued: &RunName, from: u64) -> JournalObject {
    JournalObject::Seal(Seal {
        by: "adopter".into(),
        instance: continued.instance().to_owned(),
        seal: SealKind::Adopt,
        continued: Some(continued.clone()),
        from,
        retain_below: 0,
    })
}

fn header(run: &RunName, slot: u64, floor: u64, object: JournalObject) -> JournalHeader {
    JournalHeader {
        run: run.clone(),
        slot,
        nonce: format!("crafted-{slot}-{}", rand_tag(run, slot)),
        floor,
        object,
    }
}

fn rand_tag(run: &RunName, slot: u64) -> String {
    let d = Sha256::digest(format!("{run}/{slot}"));
    d.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// One batch of `writer` with `sections`, landed and settled; its slot.
async fn batch(r: &Replica, writer: &mut Run, sections: Vec<SectionInput>) -> u64 {
    batch_meta(r, writer, sections, BatchMeta::new(1)).await
}

async fn batch_meta(
    r: &Replica,
    writer: &mut Run,
    sections: Vec<SectionInput>,
    meta: BatchMeta,
) -> u64 {
    let b = r.issue_batch(writer, sections, meta).await.unwrap();
    let slot = b.slot();
    let l = r.land_batch(&b).await;
    assert!(matches!(l, BatchLanding::Landed), "{l:?}");
    writer.settle(b, l).unwrap();
    slot
}

/// What a walk decided: the runs it entered and where, its end, its tenure and the newest
/// section it read (run, slot, commit).
#[derive(Debug, PartialEq, Eq)]
struct Decided {
    visited: Vec<(String, u64)>,
    end: ScanEnd,
    tenure: WalkTenure,
    newest: Option<(String, u64, u64)>,
}

fn decided(walk: &Result<Walk, Error>) -> Result<Decided, String> {
    match walk {
        Ok(w) => Ok(Decided {
            visited: w
                .visited
                .iter()
                .map(|(e, l)| (l.run.to_string(), *e))
                .collect(),
            end: w.end.clone(),
            tenure: w.tenure.clone(),
            newest: w
                .newest
                .as_ref()
                .map(|(l, s)| (l.header.run.to_string(), l.header.slot, s.commit)),
        }),
        Err(e) => Err(format!("{e}")),
    }
}

/// What an org's walk decided.
fn org_decided(walk: &Result<OrgWalk, Error>) -> Result<String, String> {
    match walk {
        Ok(w) => {
            let runs: Vec<Decided> = w
                .runs
                .iter()
                .map(|r| decided(&Ok(r.clone())).unwrap())
                .collect();
            let state = match &w.state {
                WalkState::Section { batch, section } => format!(
                    "section {}/{} commit {}",
                    batch.header.run, batch.header.slot, section.commit
                ),
                other => format!("{other:?}"),
            };
            Ok(format!(
                "{runs:?} | {state} | {:?} | round {}",
                w.end, w.highest_round
            ))
        }
        Err(e) => Err(format!("{e}")),
    }
}

/// The same walk on a handle with no shared listings: what the store says now.
async fn fresh_walk(
    store: &Arc<dyn ObjectStore>,
    o: &OrgId,
    run: &RunName,
    entry: u64,
    t: WalkTenure,
) -> Result<Decided, String> {
    decided(&open(store.clone()).await.walk_runs(o, run, entry, t).await)
}

// ---------------------------------------------------------------------------------------
// A store that holds a LIST at a gate, runs a hook just before one GET, and records both
// ---------------------------------------------------------------------------------------

struct Interpose {
    inner: Arc<dyn ObjectStore>,
    get_hooks: Mutex<Vec<(Path, BoxFuture<'static, ()>)>>,
    list_gates: Mutex<Vec<(String, BoxFuture<'static, ()>)>>,
    lists: Mutex<Vec<(String, Option<String>)>>,
    gets: Mutex<Vec<String>>,
}

impl Interpose {
    fn new(inner: Arc<dyn ObjectStore>) -> Arc<Interpose> {
        Arc::new(Interpose {
            inner,
            get_hooks: Mutex::new(Vec::new()),
            list_gates: Mutex::new(Vec::new()),
            lists: Mutex::new(Vec::new()),
            gets: Mutex::new(Vec::new()),
        })
    }

    /// Runs `hook` once, just before the first GET of `at` reaches the store.
    fn before_get(&self, at: Path, hook: BoxFuture<'static, ()>) {
        self.get_hooks.lock().unwrap().push((at, hook));
    }

    /// Holds the next LIST under `prefix` until `gate` completes (the LIST itself runs after).
    fn gate_list(&self, prefix: String, gate: BoxFuture<'static, ()>) {
        self.list_gates.lock().unwrap().push((prefix, gate));
    }

    fn take_gets(&self) -> Vec<String> {
        std::mem::take(&mut *self.gets.lock().unwrap())
    }

    fn take_lists(&self) -> Vec<(String, Option<String>)> {
        std::mem::take(&mut *self.lists.lock().unwrap())
    }

    fn gated(
        &self,
        prefix: Option<&Path>,
        offset: Option<&Path>,
    ) -> BoxStream<'static, OsResult<ObjectMeta>> {
        let p = prefix.map(ToString::to_string).unwrap_or_default();
        self.lists
            .lock()
            .unwrap()
            .push((p.clone(), offset.map(ToString::to_string)));
        let gate = {
            let mut gates = self.list_gates.lock().unwrap();
            gates
                .iter()
                .position(|(g, _)| *g == p)
                .map(|i| gates.remove(i).1)
        };
        let inner = self.inner.clone();
        let (prefix, offset) = (prefix.cloned(), offset.cloned());
        let list = move || match &offset {
            Some(off) => inner.list_with_offset(prefix.as_ref(), off),
            None => inner.list(prefix.as_ref()),
        };
        match gate {
            None => list(),
            Some(gate) => futures::stream::once(async move {
                gate.await;
                list()
            })
            .flatten()
            .boxed(),
        }
    }
}

impl std::fmt::Debug for Interpose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Interpose")
    }
}

impl std::fmt::Display for Interpose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Interpose({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Interpose {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> OsResult<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> OsResult<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> OsResult<GetResult> {
        self.gets.lock().unwrap().push(location.to_string());
        let hook = {
            let mut hooks = self.get_hooks.lock().unwrap();
            hooks
                .iter()
                .position(|(p, _)| p == location)
                .map(|i| hooks.remove(i).1)
        };
        if let Some(h) = hook {
            h.await;
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, OsResult<Path>>,
    ) -> BoxStream<'static, OsResult<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, OsResult<ObjectMeta>> {
        self.gated(prefix, None)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, OsResult<ObjectMeta>> {
        self.gated(prefix, Some(offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> OsResult<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> OsResult<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A gate: the future the store awaits (it says when the LIST or GET reached it, then waits
/// for `go`), the receiver that hears it arrived, and the sender that lets it through.
fn gate() -> (
    BoxFuture<'static, ()>,
    oneshot::Receiver<()>,
    oneshot::Sender<()>,
) {
    let (arrived_tx, arrived_rx) = oneshot::channel::<()>();
    let (go_tx, go_rx) = oneshot::channel::<()>();
    let fut = Box::pin(async move {
        let _ = arrived_tx.send(());
        let _ = go_rx.await;
    });
    (fut, arrived_rx, go_tx)
}

// ---------------------------------------------------------------------------------------
// Finding 1: a walk lists from the lowest slot any earlier walk of the run entered at
// ---------------------------------------------------------------------------------------

/// Writer H holds `p` and `q` in run R (round 1, claim 1). Handle B walks `p` from slot 1
/// while R holds only slot 1 (B's LIST of R is from 1). H lands slots 2-5; slot 5's header
/// says every entry is at 5 or above (both orgs checkpointed through 4), so T3 lets retention
/// delete slots 1-4. B walks `q` from its entry 5: the walk must list R from 5, as its own
/// LIST would, reading no header below 5: retention deletes slots 1-4 at the moment B would
/// GET the header of slot 3 if it listed R from the kept listing's start (1), which would
/// fail the walk with `MissingObject`. B's walk must agree with a fresh handle's (commit 5).
#[tokio::test]
async fn a_walk_above_retention_reads_nothing_below_its_entry_after_a_lower_walk() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let w = open(raw.clone()).await;
    let (p, q) = (org("p"), org("q"));
    let run = run_of(1);
    let mut h = Run::new(run.clone(), "h", 4)?;
    h.attach(&p, 1)?;
    h.attach(&q, 1)?;
    batch(
        &w,
        &mut h,
        vec![section(&p, claim(1), 1), section(&q, claim(1), 1)],
    )
    .await;

    let spied = Interpose::new(raw.clone());
    let b = open(spied.clone()).await;
    let first = decided(&b.walk_runs(&p, &run, 1, tenure(1, 1)).await);
    assert_eq!(first, fresh_walk(&raw, &p, &run, 1, tenure(1, 1)).await);

    for c in 2..=4 {
        batch(
            &w,
            &mut h,
            vec![section(&p, claim(1), c), section(&q, claim(1), c)],
        )
        .await;
    }
    batch_meta(
        &w,
        &mut h,
        vec![section(&q, claim(1), 5)],
        BatchMeta::new(5),
    )
    .await;

    // Retention of R (another process) runs between B's LIST and B's GET of slot 3.
    let retainer = w.clone();
    let retained_run = run.clone();
    let deleted = Arc::new(Mutex::new(Vec::new()));
    let seen = deleted.clone();
    spied.before_get(
        jpath(&run, 3),
        Box::pin(async move {
            let r = retainer.retain_run(&retained_run, 0).await.unwrap();
            *seen.lock().unwrap() = r.deleted;
        }),
    );
    let walked = decided(&b.walk_runs(&q, &run, 5, tenure(1, 1)).await);
    let fresh = fresh_walk(&raw, &q, &run, 5, tenure(1, 1)).await;
    let deleted = deleted.lock().unwrap().clone();
    eprintln!("retention deleted {deleted:?} (all below the walk's entry 5)");
    assert!(deleted.iter().all(|s| *s < 5));
    assert_eq!(
        walked, fresh,
        "a walk of q entering R at 5 listed R from slot 1 (an earlier walk's entry) and failed on \
         retention below its own entry"
    );
    Ok(())
}

/// The cost side of the same rule, with nothing deleted: after one walk entered R at 1, a
/// walk entering at 5 makes the LIST and header GETs its own walk would (after slot 4, one
/// header), not a LIST from slot 1 with GETs of headers 2-4 it never scans (at 1,000 orgs,
/// about 250 KB each once they left the 64 MiB header cache).
#[tokio::test]
async fn a_walk_lists_from_its_own_entry_not_from_an_earlier_walks_lower_one() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let w = open(raw.clone()).await;
    let (p, q) = (org("p"), org("q"));
    let run = run_of(1);
    let mut h = Run::new(run.clone(), "h", 4)?;
    h.attach(&p, 1)?;
    h.attach(&q, 1)?;
    batch(&w, &mut h, vec![section(&p, claim(1), 1)]).await;

    let spied = Interpose::new(raw.clone());
    let b = open(spied.clone()).await;
    b.walk_runs(&p, &run, 1, tenure(1, 1)).await?;
    for c in 2..=5 {
        batch(&w, &mut h, vec![section(&q, claim(1), c)]).await;
    }

    spied.take_gets();
    spied.take_lists();
    let walked = decided(&b.walk_runs(&q, &run, 5, tenure(1, 1)).await);
    let (b_lists, b_gets) = (spied.take_lists(), spied.take_gets());

    let own = Interpose::new(raw.clone());
    let f = open(own.clone()).await;
    own.take_gets();
    own.take_lists();
    let fresh = decided(&f.walk_runs(&q, &run, 5, tenure(1, 1)).await);
    let (f_lists, f_gets) = (own.take_lists(), own.take_gets());

    assert_eq!(walked, fresh);
    eprintln!("shared: LIST {b_lists:?}, GET {b_gets:?}");
    eprintln!("own:    LIST {f_lists:?}, GET {f_gets:?}");
    assert_eq!(
        (b_lists, b_gets),
        (f_lists, f_gets),
        "the walk entering at 5 listed and read headers below its entry"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Finding 2: a later hop reads a listing older than the object that led there
// ---------------------------------------------------------------------------------------

/// H holds `o` in run A (a section at A/1). C holds `p` in run Cr (Cr/1). On handle B:
/// 1. walk W of `o` from A/1 begins; its LIST of A is held at a gate;
/// 2. a walk of `p` (begun after W) lists Cr: [1];
/// 3. C's put fails and C self-seals Cr at slot 2 (continued Cr2), then its claim of `o`
///    (seq 7, round 2, naming Cr from 1, made before the seal) gets its exclusion at A/2;
///    C serves `o` and acknowledges commit 20 at Cr2/1;
/// 4. W's LIST of A runs: it sees the exclusion and hops to Cr at 1, where step 2's listing
///    (its LIST began after W did) lacks the self-seal that landed **before** the exclusion
///    that sent W there.
///
/// No instant had "the exclusion in A, Cr unsealed": each hop's listing must begin after
/// the hop was decided, so W, like its own LIST of Cr after reading A, ends in Cr2 with
/// commit 20, acknowledged before W's LIST of A ran (reading step 2's listing it would end
/// held in Cr with H's state).
#[tokio::test]
async fn a_later_hop_never_reads_a_listing_older_than_the_exclusion_that_led_there() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let w = open(raw.clone()).await;
    let (o, p) = (org("o"), org("p"));
    let (a, cr) = (run_of(0xa), run_of(0xc));
    let mut h = Run::new(a.clone(), "h", 4)?;
    h.attach(&o, 1)?;
    batch(&w, &mut h, vec![section(&o, claim(1), 1)]).await;
    let mut c = Run::new(cr.clone(), "c", 4)?;
    c.attach(&p, 1)?;
    batch(&w, &mut c, vec![section(&p, claim(1), 10)]).await;

    let spied = Interpose::new(raw.clone());
    let b = open(spied.clone()).await;
    let (g, arrived, go) = gate();
    spied.gate_list(jdir(&a), g);
    let mut walk = Box::pin(b.walk_runs(&o, &a, 1, tenure(1, 1)));
    assert!(futures::poll!(walk.as_mut()).is_pending());
    arrived.await?;

    // Another org's walk on B lists Cr (after W began).
    b.walk_runs(&p, &cr, 1, tenure(1, 1)).await?;

    // C self-seals Cr, its exclusion of o lands in A, it serves o in Cr2.
    let (mut c2, _) = w.seal_self(&mut c, 1).await?;
    assert_eq!(c2.name(), &cr.next());
    put_object(&raw, &header(&a, 2, 2, exclusion(&o, 7, 2, &cr, 1))).await;
    c2.attach(&o, 2)?;
    batch(&w, &mut c2, vec![section(&o, claim(7), 20)]).await;

    go.send(()).unwrap();
    let walked = decided(&walk.await);
    let fresh = fresh_walk(&raw, &o, &a, 1, tenure(1, 1)).await;
    eprintln!("shared: {walked:?}\nown:    {fresh:?}");
    assert_eq!(
        walked, fresh,
        "the walk read Cr's listing from before its self-seal, which landed before the \
         exclusion that led the walk into Cr"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Clauses checked and found sound
// ---------------------------------------------------------------------------------------

/// SealedListings, J3-4's hole: H (window 4) has A/1 (o, commit 1) landed, A/2 (o, commit 2)
/// in flight, A/3 (p) landed; an adopter's seal lands at A/4. Handle B walks `o` from 1
/// (listing 1, 3, seal 4: the kept part is [3, 4]). Then H's late batch lands in the hole at
/// 2, inside H's prefix below the seal (acknowledged). B's next walk from 1 must read commit
/// 2; a walk from 3 is served by the kept part and must agree with a fresh walk too.
#[tokio::test]
async fn a_hole_below_an_adopt_seal_filled_by_the_dead_writers_late_batch_is_read() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let w = open(raw.clone()).await;
    let (o, p) = (org("o"), org("p"));
    let (a, adopter) = (run_of(0xa), run_of(0xad));
    let mut h = Run::new(a.clone(), "h", 4)?;
    h.attach(&o, 1)?;
    h.attach(&p, 1)?;
    batch(&w, &mut h, vec![section(&o, claim(1), 1)]).await;
    let late = w
        .issue_batch(&mut h, vec![section(&o, claim(1), 2)], BatchMeta::new(1))
        .await?;
    let third = w
        .issue_batch(&mut h, vec![section(&p, claim(1), 3)], BatchMeta::new(1))
        .await?;
    assert!(matches!(w.land_batch(&third).await, BatchLanding::Landed));
    put_object(&raw, &header(&a, 4, 2, adopt_seal(&adopter, 1))).await;

    let b = open(raw.clone()).await;
    for entry in [1, 3] {
        let walked = decided(&b.walk_runs(&o, &a, entry, tenure(1, 1)).await);
        assert_eq!(walked, fresh_walk(&raw, &o, &a, entry, tenure(1, 1)).await);
    }

    assert!(matches!(w.land_batch(&late).await, BatchLanding::Landed));
    for entry in [1, 2, 3, 4] {
        let walked = decided(&b.walk_runs(&o, &a, entry, tenure(1, 1)).await);
        assert_eq!(
            walked,
            fresh_walk(&raw, &o, &a, entry, tenure(1, 1)).await,
            "entry {entry}"
        );
    }
    let from1 = decided(&b.walk_runs(&o, &a, 1, tenure(1, 1)).await).unwrap();
    assert_eq!(from1.newest, Some((a.to_string(), 2, 2)));
    Ok(())
}

/// SealedListings, adopt_run's `fill_holes`: the same run, but the hole at 2 is filled by
/// the adopter's second seal instead. Walks from 1 must meet the second seal (a tenure via
/// slot 2), whatever B kept from its listing with the hole.
#[tokio::test]
async fn a_second_seal_filling_a_hole_below_a_kept_listing_is_met() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let w = open(raw.clone()).await;
    let (o, p) = (org("o"), org("p"));
    let (a, adopter) = (run_of(0xa), run_of(0xad));
    let mut h = Run::new(a.clone(), "h", 4)?;
    h.attach(&o, 1)?;
    h.attach(&p, 1)?;
    batch(&w, &mut h, vec![section(&o, claim(1), 1)]).await;
    let _never = w
        .issue_batch(&mut h, vec![section(&o, claim(1), 2)], BatchMeta::new(1))
        .await?;
    let third = w
        .issue_batch(&mut h, vec![section(&o, claim(1), 3)], BatchMeta::new(1))
        .await?;
    assert!(matches!(w.land_batch(&third).await, BatchLanding::Landed));
    put_object(&raw, &header(&a, 4, 2, adopt_seal(&adopter, 1))).await;
    // The adopter's run, with an attach section of o via the seal at 2 (the lowest of its).
    let mut i = Run::new(adopter.clone(), "adopter", 4)?;
    i.attach(&o, 2)?;

    let b = open(raw.clone()).await;
    let before = decided(&b.walk_runs(&o, &a, 1, tenure(1, 1)).await);
    assert_eq!(before, fresh_walk(&raw, &o, &a, 1, tenure(1, 1)).await);

    // fill_holes: a second seal, same body, at 2.
    put_object(&raw, &header(&a, 2, 2, adopt_seal(&adopter, 1))).await;
    batch(
        &w,
        &mut i,
        vec![section(
            &o,
            Via::Adopt {
                run: a.clone(),
                slot: 2,
            },
            30,
        )],
    )
    .await;
    for entry in [1, 2, 3] {
        let walked = decided(&b.walk_runs(&o, &a, entry, tenure(1, 1)).await);
        assert_eq!(
            walked,
            fresh_walk(&raw, &o, &a, entry, tenure(1, 1)).await,
            "entry {entry}"
        );
    }
    Ok(())
}

/// RunListings: walk W1 of `p` lists A on handle B; its LIST returned [1] and W1 is held at
/// its header GET of slot 1 (still inside the run's one-at-a-time LIST). An exclusion of `o`
/// (round 2, naming Cr) lands at A/2; then walk W2 of `o` begins on B and waits for the
/// run's LIST. W2 must not read W1's listing (begun before W2): it ends in Cr with commit 40.
#[tokio::test]
async fn a_walk_begun_after_an_exclusion_landed_never_reads_a_listing_without_it() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let w = open(raw.clone()).await;
    let (o, p) = (org("o"), org("p"));
    let (a, cr) = (run_of(0xa), run_of(0xc));
    let mut h = Run::new(a.clone(), "h", 4)?;
    h.attach(&o, 1)?;
    h.attach(&p, 1)?;
    batch(
        &w,
        &mut h,
        vec![section(&o, claim(1), 1), section(&p, claim(1), 1)],
    )
    .await;
    let mut c = Run::new(cr.clone(), "c", 4)?;
    c.attach(&o, 2)?;
    batch(&w, &mut c, vec![section(&o, claim(7), 40)]).await;

    let spied = Interpose::new(raw.clone());
    let b = open(spied.clone()).await;
    let (g, arrived, go) = gate();
    spied.before_get(jpath(&a, 1), g);
    let mut w1 = Box::pin(b.walk_runs(&p, &a, 1, tenure(1, 1)));
    assert!(futures::poll!(w1.as_mut()).is_pending());
    arrived.await?;

    put_object(&raw, &header(&a, 2, 2, exclusion(&o, 7, 2, &cr, 1))).await;
    let mut w2 = Box::pin(b.walk_runs(&o, &a, 1, tenure(1, 1)));
    assert!(futures::poll!(w2.as_mut()).is_pending());
    go.send(()).unwrap();
    let (r1, r2) = futures::join!(w1, w2);
    assert_eq!(decided(&r1).unwrap().end, ScanEnd::Held { end_slot: 2 });
    let walked = decided(&r2);
    assert_eq!(walked, fresh_walk(&raw, &o, &a, 1, tenure(1, 1)).await);
    assert_eq!(walked.unwrap().newest, Some((cr.to_string(), 1, 40)));
    Ok(())
}

/// `sections_of` past 16 sections (the index), with every org's walk sharing one listing:
/// 20 orgs in one batch, odd orgs again in the next, an exclusion of org 3 at slot 3, then a
/// batch of every org (org 3's there is of the fenced tenure). Each org's walk on one handle,
/// all at once, agrees with a fresh handle's, in its own tenure and in a tenure nobody has.
#[tokio::test]
async fn twenty_orgs_sharing_listings_each_find_their_own_section() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let w = open(raw.clone()).await;
    let orgs: Vec<OrgId> = (0..20).map(|i| org(&format!("org{i:02}"))).collect();
    let (a, cr) = (run_of(0xa), run_of(0xc));
    let mut h = Run::new(a.clone(), "h", 8)?;
    for o in &orgs {
        h.attach(o, 1)?;
    }
    let all = |commit: u64| -> Vec<SectionInput> {
        orgs.iter()
            .enumerate()
            .map(|(i, o)| section(o, claim(1), commit * 100 + i as u64))
            .collect()
    };
    batch(&w, &mut h, all(1)).await;
    let odd: Vec<SectionInput> = orgs
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(i, o)| section(o, claim(1), 200 + i as u64))
        .collect();
    batch(&w, &mut h, odd).await;
    put_object(&raw, &header(&a, 3, 3, exclusion(&orgs[3], 9, 2, &cr, 1))).await;
    // H resolves slot 3 as the exclusion; its next batch goes at 4.
    let taken = w.issue_batch(&mut h, Vec::new(), BatchMeta::new(1)).await?;
    let l = w.land_batch(&taken).await;
    h.settle(taken, l)?;
    let fourth: Vec<SectionInput> = orgs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3)
        .map(|(i, o)| section(o, claim(1), 400 + i as u64))
        .collect();
    batch(&w, &mut h, fourth).await;

    let b = open(raw.clone()).await;
    for t in [tenure(1, 1), tenure(5, 5)] {
        let walks =
            futures::future::join_all(orgs.iter().map(|o| b.walk_runs(o, &a, 1, t.clone()))).await;
        for (o, walked) in orgs.iter().zip(&walks) {
            assert_eq!(
                decided(walked),
                fresh_walk(&raw, o, &a, 1, t.clone()).await,
                "{o} in {t:?}"
            );
        }
    }
    Ok(())
}

/// SealedListings and retention: H holds `o` and `p` in A; B walks `o` from 1 (a legal
/// entry then) and keeps A's listing up to H's self-seal at 4. Both orgs go on in A2; the
/// seal's `retain_below` is 3 (both orgs checkpointed through 2), so retention deletes A/1
/// and A/2; a paused claimant's late exclusion of `o` lands in the freed slot 1 (below every
/// entry). Walks entering A at 3 and 4 on B agree with fresh ones, and so does a walk from
/// A2/1.
#[tokio::test]
async fn a_kept_sealed_listing_outlives_retention_below_every_entry() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let w = open(raw.clone()).await;
    let (o, p) = (org("o"), org("p"));
    let (a, cr) = (run_of(0xa), run_of(0xc));
    let mut h = Run::new(a.clone(), "h", 4)?;
    h.attach(&o, 1)?;
    h.attach(&p, 1)?;
    for c in 1..=3 {
        batch(
            &w,
            &mut h,
            vec![section(&o, claim(1), c), section(&p, claim(1), c)],
        )
        .await;
    }
    let (mut h2, _) = w.seal_self(&mut h, 3).await?;

    let b = open(raw.clone()).await;
    let before = decided(&b.walk_runs(&o, &a, 1, tenure(1, 1)).await);
    assert_eq!(before, fresh_walk(&raw, &o, &a, 1, tenure(1, 1)).await);

    batch(&w, &mut h2, vec![section(&o, claim(1), 50)]).await;
    let retained = w.retain_run(&a, 0).await?;
    assert_eq!(retained.deleted, vec![1, 2]);
    put_object(&raw, &header(&a, 1, 1, exclusion(&o, 9, 2, &cr, 1))).await;

    for entry in [3, 4] {
        let walked = decided(&b.walk_runs(&o, &a, entry, tenure(1, 1)).await);
        assert_eq!(
            walked,
            fresh_walk(&raw, &o, &a, entry, tenure(1, 1)).await,
            "entry {entry}"
        );
    }
    let a2 = a.next();
    assert_eq!(
        decided(&b.walk_runs(&p, &a2, 1, tenure(1, 1)).await),
        fresh_walk(&raw, &p, &a2, 1, tenure(1, 1)).await
    );
    Ok(())
}

/// K0 over the log, a release seal followed by claimants: `o` is claimed after `empty` into
/// A (claim 1), released by H's release seal at A/3; B claims it after that seal into Br
/// (claim 2, round 2) and acknowledges; handle X walks `o` (keeping A's sealed listing and
/// sharing Br's). Then B self-seals Br at Br/2 and acknowledges in Br2/1; D claims `o`
/// (claim 3, round 3), its exclusion lands at Br2/2 and D acknowledges in Dr. After each
/// step X's walk agrees with a fresh handle's.
#[tokio::test]
async fn a_release_seal_then_two_claimants_walk_alike_on_a_kept_listing() -> R {
    let raw: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let w = open(raw.clone()).await;
    let o = org("o");
    let (a, br, dr) = (run_of(0xa), run_of(0xb), run_of(0xd));
    let claim_entry = |seq, round, run: &RunName, after| JournalClaim {
        seq,
        round,
        writer: "j".into(),
        run: run.clone(),
        from: 1,
        after,
    };
    assert!(matches!(
        w.create_journal_claim(&o, claim_entry(1, 1, &a, Some(FreePoint::Empty)))
            .await?,
        EntryCreated::Landed(_)
    ));
    let mut h = Run::new(a.clone(), "h", 4)?;
    h.attach(&o, 1)?;
    for c in 1..=2 {
        batch(&w, &mut h, vec![section(&o, claim(1), c)]).await;
    }
    let seal = w.seal_release(&mut h, 1).await?;
    assert_eq!(seal, 3);

    let x = open(raw.clone()).await;
    let check = |x: Replica, raw: Arc<dyn ObjectStore>, o: OrgId, step: &'static str| async move {
        let walked = org_decided(&x.walk_org(&o).await);
        let fresh = org_decided(&open(raw).await.walk_org(&o).await);
        assert_eq!(walked, fresh, "{step}");
        walked
    };
    check(x.clone(), raw.clone(), o.clone(), "released")
        .await
        .unwrap();

    assert!(matches!(
        w.create_journal_claim(
            &o,
            claim_entry(
                2,
                2,
                &br,
                Some(FreePoint::Seal {
                    run: a.clone(),
                    slot: 3
                })
            )
        )
        .await?,
        EntryCreated::Landed(_)
    ));
    let mut bw = Run::new(br.clone(), "b", 4)?;
    bw.attach(&o, 2)?;
    batch(&w, &mut bw, vec![section(&o, claim(2), 60)]).await;
    check(x.clone(), raw.clone(), o.clone(), "claimed after the seal")
        .await
        .unwrap();

    let (mut bw2, _) = w.seal_self(&mut bw, 1).await?;
    batch(&w, &mut bw2, vec![section(&o, claim(2), 61)]).await;
    check(
        x.clone(),
        raw.clone(),
        o.clone(),
        "the claimant's run self-sealed",
    )
    .await
    .unwrap();

    assert!(matches!(
        w.create_journal_claim(&o, claim_entry(3, 3, &dr, None))
            .await?,
        EntryCreated::Landed(_)
    ));
    put_object(&raw, &header(&br.next(), 2, 2, exclusion(&o, 3, 3, &dr, 1))).await;
    let mut dw = Run::new(dr.clone(), "d", 4)?;
    dw.attach(&o, 3)?;
    batch(&w, &mut dw, vec![section(&o, claim(3), 70)]).await;
    let last = check(
        x.clone(),
        raw.clone(),
        o.clone(),
        "excluded by a second claimant",
    )
    .await;
    assert!(last.unwrap().contains("commit 70"));
    Ok(())
}
