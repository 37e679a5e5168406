//! P9b with J5's byte trigger (`docs/design.md` 3g): the same run, but each commit appends
//! a 512-byte row (incompressible bytes, eight rows to a 4 KiB page), so every org's
//! cumulative section grows until it passes the section budget (16 KiB of fresh bytes),
//! when the org is checkpointed as a delta against its previous checkpoint
//! (`Replica::create_delta_checkpoint`, one inline log PUT) and its sections start again
//! from it. Requests per ack count the batches and the checkpoints.
//!
//! Store layer only, like P9b: no SQLite, no claims, no confirmations; the checksums are
//! placeholders nobody checks (nothing is restored).

use std::collections::BTreeMap;
use std::time::Instant;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use idem_replica::journal::{
    Base, BatchMeta, CheckpointHeader, DeltaCheckpoint, EntryCreated, Run, RunName,
};
use idem_replica::journal::{SectionInput, Via};
use idem_replica::{Delta, OrgId, Replica};

use crate::BenchResult;

/// Slots a run keeps in flight.
const WINDOW: u64 = 4;
/// Bytes of a commit's row.
const ROW: usize = 512;
/// Rows to a page.
const ROWS_PER_PAGE: u64 = 8;
/// J5's section budget, in fresh bytes since the base (incompressible, so about the
/// compressed size).
pub(crate) const SECTION_BUDGET: u64 = 16 * 1024;

/// One org's writer state.
struct Org {
    id: OrgId,
    /// The commit its newest acknowledged section holds.
    acked: u64,
    /// The base its sections are cumulative from: log seq and commit.
    base: (u64, u64),
    /// Its next log seq (after its own newest entry).
    next_seq: u64,
    /// A checkpoint in flight.
    checkpointing: bool,
    made: Instant,
}

/// The row of commit `r` (1-based) of org `i`: incompressible bytes.
fn row_bytes(i: u64, r: u64) -> [u8; ROW] {
    let mut x = (i << 32 | r).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = [0u8; ROW];
    for b in out.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    out
}

/// The pages holding rows `after + 1 ..= upto` of org `i`, each with every row written to
/// it by `upto` (page 3 holds rows 1-8, and so on), as a delta to `upto`'s database.
fn pages_since(i: u64, after: u64, upto: u64) -> BenchResult<Delta> {
    let page_of = |r: u64| 3 + (r - 1) / ROWS_PER_PAGE;
    let mut pages = BTreeMap::new();
    for p in page_of(after + 1)..=page_of(upto) {
        let mut page = vec![0u8; 4096];
        let first = (p - 3) * ROWS_PER_PAGE + 1;
        for r in first..=upto.min(first + ROWS_PER_PAGE - 1) {
            let at = ((r - first) as usize) * ROW;
            page[at..at + ROW].copy_from_slice(&row_bytes(i, r));
        }
        pages.insert(p as u32, page);
    }
    Ok(Delta::new(4096, page_of(upto) as u32, pages, upto)?)
}

/// `ticks` batches over `n` orgs with checkpoints; the cell: acks/s, ack p50 / p99,
/// requests per ack (batches and checkpoints), PUT dollars per million acks, checkpoints
/// per ack.
pub(crate) async fn one_row(replica: &Replica, n: usize, ticks: usize) -> BenchResult<String> {
    let instance = replica.instance().to_owned();
    let mut run = Run::new(RunName::new(&instance, 1)?, "bench", WINDOW)?;
    let mut orgs = Vec::with_capacity(n);
    for i in 0..n {
        let id = OrgId::new(&format!("org-{i:05}"))?;
        run.attach(&id, 1)?;
        orgs.push(Org {
            id,
            acked: 0,
            base: (1, 0),
            next_seq: 2,
            checkpointing: false,
            made: Instant::now(),
        });
    }
    let index: BTreeMap<OrgId, usize> = orgs.iter().map(|o| o.id.clone()).zip(0..).collect();
    let mut waiting: Vec<usize> = (0..n).collect();
    let (mut latencies, mut checkpoints) = (Vec::with_capacity(n * ticks), 0usize);
    let mut batches = FuturesUnordered::new();
    let mut ckpts = FuturesUnordered::new();
    let mut issued = 0usize;
    let before = replica.store_requests();
    let started = Instant::now();
    loop {
        while issued < ticks && !waiting.is_empty() && run.room() > 0 {
            let mut sections = Vec::with_capacity(waiting.len());
            for i in waiting.drain(..) {
                let o = &orgs[i];
                sections.push(SectionInput {
                    org: o.id.clone(),
                    via: Via::Claim { seq: 1 },
                    base: Base {
                        seq: o.base.0,
                        checksum: "bench".into(),
                    },
                    checksum: format!("{i}-{}", o.acked + 1),
                    pages: pages_since(i as u64, o.base.1, o.acked + 1)?,
                    released: false,
                });
            }
            let batch = replica
                .issue_batch(&mut run, sections, BatchMeta::new(1))
                .await?;
            issued += 1;
            batches.push(async move {
                let landing = replica.land_batch(&batch).await;
                (batch, landing)
            });
        }
        tokio::select! {
            Some((batch, landing)) = batches.next() => {
                for (id, commit) in run.settle(batch, landing)? {
                    let i = index[&id];
                    let o = &mut orgs[i];
                    latencies.push(o.made.elapsed());
                    o.acked = commit;
                    o.made = Instant::now();
                    waiting.push(i);
                    let fresh = (commit - o.base.1) * ROW as u64;
                    if fresh >= SECTION_BUDGET && !o.checkpointing {
                        o.checkpointing = true;
                        let checkpoint = DeltaCheckpoint {
                            header: CheckpointHeader {
                                seq: o.next_seq,
                                round: 1,
                                writer: "bench".into(),
                                run: run.name().clone(),
                                through: run.resolved_below() - 1,
                                tenure: Via::Claim { seq: 1 },
                                released: false,
                            },
                            base: Base { seq: o.base.0, checksum: "bench".into() },
                            checksum: format!("{i}-{commit}"),
                            pages: pages_since(i as u64, o.base.1, commit)?,
                        };
                        let id = o.id.clone();
                        ckpts.push(async move {
                            let seq = checkpoint.header.seq;
                            let created = replica.create_delta_checkpoint(&id, checkpoint).await;
                            (i, seq, commit, created)
                        });
                    }
                }
                if run.needs_seal() {
                    return Err("a batch failed on the bench's store".into());
                }
            }
            Some((i, seq, commit, created)) = ckpts.next() => {
                match created? {
                    EntryCreated::Landed(_) => {}
                    EntryCreated::Taken(e) => return Err(format!("checkpoint slot taken: {e:?}").into()),
                }
                let o = &mut orgs[i];
                o.checkpointing = false;
                o.base = (seq, commit);
                o.next_seq = seq + 1;
                checkpoints += 1;
            }
            else => break,
        }
    }
    let cost = replica.store_requests().since(&before);
    let acks = latencies.len().max(1);
    Ok(format!(
        "{}, {:.3} checkpoints/ack",
        super::ack_cell(&mut latencies, started.elapsed(), &cost),
        checkpoints as f64 / acks as f64
    ))
}
