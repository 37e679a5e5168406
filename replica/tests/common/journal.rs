//! Builders of the journal tests (`journal_*.rs`): run names and tenures, database images and
//! the deltas between them, an org's log entries (claims, checkpoints), a run's sections and
//! batches, and crafted journal objects written exactly as the format encodes them.

use std::collections::BTreeMap;
use std::sync::Arc;

use idem_replica::journal::{
    Base, BatchLanding, BatchMeta, Checkpoint, CheckpointHeader, DeltaCheckpoint, EntryCreated,
    Exclusion, FreePoint, JOURNAL_MAGIC, JOURNAL_VERSION, JournalClaim, JournalHeader,
    JournalObject, Run, RunName, Seal, SealKind, SectionInput, Via, WalkTenure, image_checksum,
};
use idem_replica::{Delta, OrgId, Replica, Snapshot};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};
use sha2::{Digest, Sha256};

// ---------------------------------------------------------------------------------------
// Runs and tenures
// ---------------------------------------------------------------------------------------

/// The instance id numbered `n` (32 hex digits).
pub fn inst(n: u64) -> String {
    format!("{n:032x}")
}

/// The first run of instance `n`.
pub fn run_of(n: u64) -> RunName {
    RunName::new(&inst(n), 1).unwrap()
}

/// A tenure by the claim at `seq`.
pub fn claim(seq: u64) -> Via {
    Via::Claim { seq }
}

/// A walk's tenure: round `round`, by the claim at `claim`.
pub fn tenure(round: u64, claim: u64) -> WalkTenure {
    WalkTenure {
        round,
        via: Via::Claim { seq: claim },
    }
}

// ---------------------------------------------------------------------------------------
// Images and deltas
// ---------------------------------------------------------------------------------------

/// A canonical database image with `rows` rows of 700 random bytes, at commit `commit`.
pub fn image(rows: u64, commit: u64) -> Vec<u8> {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    conn.execute_batch("PRAGMA page_size = 4096; CREATE TABLE t(x, y);")
        .unwrap();
    for i in 0..rows {
        conn.execute(
            "INSERT INTO t VALUES (?1, randomblob(700))",
            rusqlite::params![i as i64],
        )
        .unwrap();
    }
    Snapshot::take(&conn, |_| Ok(commit))
        .unwrap()
        .bytes()
        .to_vec()
}

/// The pages of `next` that differ from `prev`, as a delta to commit `commit`.
pub fn diff(prev: &[u8], next: &[u8], commit: u64) -> Delta {
    let ps = 4096;
    let mut pages = BTreeMap::new();
    for (i, page) in next.chunks(ps).enumerate() {
        if prev.get(i * ps..(i + 1) * ps) != Some(page) {
            pages.insert(i as u32 + 1, page.to_vec());
        }
    }
    Delta::new(ps as u32, (next.len() / ps) as u32, pages, commit).unwrap()
}

/// Two made-up pages (2 and 3 of 3) filled from `commit`: a section's pages when no walk
/// rebuilds its image.
pub fn pages(commit: u64) -> Delta {
    let fill = commit as u8;
    Delta::new(
        4096,
        3,
        BTreeMap::from([(2, vec![fill; 4096]), (3, vec![fill ^ 0x5a; 4096])]),
        commit,
    )
    .unwrap()
}

// ---------------------------------------------------------------------------------------
// An org's log
// ---------------------------------------------------------------------------------------

/// Where `o`'s log entry `seq` is.
pub fn log_path(o: &OrgId, seq: u64) -> Path {
    Path::from(format!("orgs/{o}/log/{seq:020}.json"))
}

/// The seq of an entry that landed; panics if its slot was taken.
pub fn landed(created: EntryCreated) -> u64 {
    match created {
        EntryCreated::Landed(e) => e.seq(),
        EntryCreated::Taken(e) => panic!("slot taken by {e:?}"),
    }
}

/// A journal claim of writer "j" at `seq` in round `round`, continuing in `run` from slot 1,
/// after `after`: its seq.
pub async fn claim_after(
    r: &Replica,
    o: &OrgId,
    (seq, round): (u64, u64),
    run: &RunName,
    after: Option<FreePoint>,
) -> u64 {
    landed(
        r.create_journal_claim(
            o,
            JournalClaim {
                seq,
                round,
                writer: "j".into(),
                run: run.clone(),
                from: 1,
                after,
            },
        )
        .await
        .unwrap(),
    )
}

/// The header of a checkpoint of writer "j" at `seq` in round `round`, in `run` through slot
/// `through`, in the tenure `via`.
pub fn cp_header(
    (seq, round): (u64, u64),
    run: &RunName,
    via: &Via,
    through: u64,
    released: bool,
) -> CheckpointHeader {
    CheckpointHeader {
        seq,
        round,
        writer: "j".into(),
        run: run.clone(),
        through,
        tenure: via.clone(),
        released,
    }
}

/// A snapshot checkpoint with `header` of `img` (commit `commit`): its seq.
pub async fn checkpoint(
    r: &Replica,
    o: &OrgId,
    header: CheckpointHeader,
    img: &[u8],
    commit: u64,
) -> u64 {
    let snapshot = Snapshot::from_bytes(img.to_vec(), commit);
    landed(
        r.create_checkpoint(o, Checkpoint { header, snapshot })
            .await
            .unwrap(),
    )
}

/// A snapshot checkpoint (not released) of `img` (commit `commit`) through `through`: its
/// seq.
#[allow(clippy::too_many_arguments)]
pub async fn snap_cp(
    r: &Replica,
    o: &OrgId,
    seq_round: (u64, u64),
    run: &RunName,
    via: &Via,
    through: u64,
    img: &[u8],
    commit: u64,
) -> u64 {
    let header = cp_header(seq_round, run, via, through, false);
    checkpoint(r, o, header, img, commit).await
}

/// A delta checkpoint (not released) from `base` (at `base_seq`) to `next` (commit `commit`)
/// through `through`: its seq.
#[allow(clippy::too_many_arguments)]
pub async fn delta_cp(
    r: &Replica,
    o: &OrgId,
    seq_round: (u64, u64),
    run: &RunName,
    via: &Via,
    through: u64,
    (base_seq, base): (u64, &[u8]),
    next: &[u8],
    commit: u64,
) -> u64 {
    landed(
        r.create_delta_checkpoint(
            o,
            DeltaCheckpoint {
                header: cp_header(seq_round, run, via, through, false),
                base: Base {
                    seq: base_seq,
                    checksum: image_checksum(base).unwrap(),
                },
                checksum: image_checksum(next).unwrap(),
                pages: diff(base, next, commit),
            },
        )
        .await
        .unwrap(),
    )
}

// ---------------------------------------------------------------------------------------
// A run's sections and batches
// ---------------------------------------------------------------------------------------

/// A section of `o` in the tenure `via` with made-up [`pages`] to commit `commit`, on a base
/// at seq 1 no walk checks.
pub fn section(o: &OrgId, via: Via, commit: u64) -> SectionInput {
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

/// A cumulative section of `o` in the tenure `via` from the image `base` (at `base_seq`) to
/// the image `next` (commit `commit`): a restore rebuilds `next` from it.
pub fn image_section(
    o: &OrgId,
    via: &Via,
    (base_seq, base): (u64, &[u8]),
    next: &[u8],
    commit: u64,
) -> SectionInput {
    SectionInput {
        org: o.clone(),
        via: via.clone(),
        base: Base {
            seq: base_seq,
            checksum: image_checksum(base).unwrap(),
        },
        checksum: image_checksum(next).unwrap(),
        pages: diff(base, next, commit),
        released: false,
    }
}

/// A writer `name` of `run` (window 4) holding each of `orgs` in round `round`.
pub fn writer(run: &RunName, name: &str, round: u64, orgs: &[&OrgId]) -> Run {
    let mut w = Run::new(run.clone(), name, 4).unwrap();
    for o in orgs {
        w.attach(o, round).unwrap();
    }
    w
}

/// One batch of `writer` with `sections` (none: an empty batch), landed and settled, its
/// landing judged by `settle` alone: its slot.
pub async fn settled_batch(r: &Replica, writer: &mut Run, sections: Vec<SectionInput>) -> u64 {
    let b = r
        .issue_batch(writer, sections, BatchMeta::new(1))
        .await
        .unwrap();
    let slot = b.slot();
    let l = r.land_batch(&b).await;
    writer.settle(b, l).unwrap();
    slot
}

/// One batch of `writer` with `sections`, which must land, settled: its slot.
pub async fn batch(r: &Replica, writer: &mut Run, sections: Vec<SectionInput>) -> u64 {
    batch_meta(r, writer, sections, BatchMeta::new(1)).await
}

/// [`batch`] with `meta`.
pub async fn batch_meta(
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

// ---------------------------------------------------------------------------------------
// Crafted journal objects
// ---------------------------------------------------------------------------------------

/// Where `run`'s object at `slot` is.
pub fn jpath(run: &RunName, slot: u64) -> Path {
    Path::from(format!("journals/{run}/{slot:020}.jnl"))
}

/// A journal object of the header `json` and nothing after it, framed as the format frames
/// one (magic, version, length, checksum).
pub fn frame(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&JOURNAL_MAGIC);
    out.extend_from_slice(&JOURNAL_VERSION.to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(json));
    out.extend_from_slice(json);
    out
}

/// A header-only journal object (a seal or an exclusion, or a batch with no sections)
/// exactly as the format encodes it.
pub fn encode(header: &JournalHeader) -> Vec<u8> {
    frame(&serde_json::to_vec(header).unwrap())
}

/// The header of a crafted object at `slot` of `run` (nonce `crafted-<slot>`).
pub fn header(run: &RunName, slot: u64, floor: u64, object: JournalObject) -> JournalHeader {
    JournalHeader {
        run: run.clone(),
        slot,
        nonce: format!("crafted-{slot}"),
        floor,
        object,
    }
}

/// An exclusion of `o` by a claim at `claim` in round `round`, continuing in `continued` from
/// slot `from`, placed by "x".
pub fn exclusion_obj(
    o: impl std::fmt::Display,
    claim: u64,
    round: u64,
    continued: &RunName,
    from: u64,
) -> JournalObject {
    JournalObject::Exclusion(Exclusion {
        org: o.to_string(),
        claim,
        round,
        continued: continued.clone(),
        from,
        by: "x".into(),
    })
}

/// A seal of `kind` by "x" of instance `inst(0xee)`, continuing in `continued` from `from`.
pub fn seal_obj(kind: SealKind, continued: Option<RunName>, from: u64) -> JournalObject {
    JournalObject::Seal(Seal {
        by: "x".into(),
        instance: inst(0xee),
        seal: kind,
        continued,
        from,
        retain_below: 0,
    })
}

/// Writes the header-only object `header` in its slot, over whatever is there.
pub async fn put_object(store: &Arc<dyn ObjectStore>, header: &JournalHeader) {
    store
        .put(
            &jpath(&header.run, header.slot),
            PutPayload::from(encode(header)),
        )
        .await
        .unwrap();
}

/// Creates the header-only object `header` in its slot create-only, as its placer would.
pub async fn create_object(store: &Arc<dyn ObjectStore>, header: &JournalHeader) {
    store
        .put_opts(
            &jpath(&header.run, header.slot),
            PutPayload::from(encode(header)),
            PutMode::Create.into(),
        )
        .await
        .unwrap();
}
