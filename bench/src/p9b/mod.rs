//! P9b, the journal's store layer (`docs/design.md` 3g; issue 28): one writer process's run
//! acknowledging N orgs that each have one commit in flight, at 1 / 100 / 1,000 / 10,000
//! orgs, on the local directory and on the latency-shaped store in one run.
//!
//! Each tick, every org whose previous commit was acknowledged commits again (one changed
//! page, about 100 bytes of it changed); the writer issues a batch holding every waiting
//! org's section as soon as the window (4) has room, and acknowledges in slot order. A
//! commit's latency runs from the tick that made it to its acknowledgement. Requests per
//! ack count every store request of the run (batches only: no checkpoints, confirmations
//! or claims, which the org layer does not make yet). PUT dollars at S3 Standard's $5 per
//! million PUTs.
//!
//! This measures the journal's store protocol through `idem_replica::journal`, not a
//! registry: the org layer does not use the journal yet.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use idem_replica::journal::{Base, BatchMeta, Run, RunName, SectionInput, Via};
use idem_replica::{Delta, OrgId, Replica, Settings};

use crate::p10::{Column, Latency, row, table_header};
use crate::{BenchResult, ms};

mod checkpoints;
mod takeover;

/// Slots a run keeps in flight.
const WINDOW: u64 = 4;

/// Runs P9b and prints its table: one row per org count, one cell per column.
///
/// # Errors
/// The first store error.
pub(crate) async fn run(
    dir: &Path,
    quick: bool,
    latency: Latency,
    takeover_only: bool,
) -> BenchResult<()> {
    let mut columns = vec![Column { shape: None }];
    if let Latency::Shaped(shape) = latency {
        columns.push(Column { shape: Some(shape) });
    }
    if !takeover_only {
        batches_and_checkpoints(dir, quick, latency, &columns).await?;
    }
    takeover_table(dir, quick, &columns).await
}

/// P9b's rows of batches, then of batches with J5 checkpoints.
async fn batches_and_checkpoints(
    dir: &Path,
    quick: bool,
    latency: Latency,
    columns: &[Column],
) -> BenchResult<()> {
    let counts: &[usize] = if quick {
        &[1, 100, 1_000]
    } else {
        &[1, 100, 1_000, 10_000]
    };
    let ticks = if quick { 12 } else { 40 };
    outln!();
    outln!(
        "P9b: the journal's store layer: one run acknowledging N orgs with one commit in flight each, window {WINDOW}, {ticks} batches per row ({latency} beside the local directory)"
    );
    table_header(columns, "active orgs", "target");
    for &n in counts {
        let mut cells = Vec::new();
        for (i, column) in columns.iter().enumerate() {
            let sub = dir.join(format!("p9b-{n}-{i}"));
            let store = column.store(&sub, n as u64)?;
            let replica = Replica::open(store, "", Settings::default()).await?;
            cells.push(one_row(&replica, n, ticks).await?);
        }
        row(
            &format!("{n}"),
            &cells,
            "≤ 0.1 req/ack, ≤ $0.50 per M acks; p50 ≤ 2 × RTT p50",
        );
    }
    let (counts, ticks): (&[usize], usize) = if quick {
        (&[100], 40)
    } else {
        (&[100, 1_000], 96)
    };
    outln!();
    outln!(
        "P9b with J5 checkpoints: each commit appends a 512-byte row; an org is checkpointed (one inline delta PUT) once its section holds {} KiB of fresh bytes; window {WINDOW}, {ticks} batches per row",
        checkpoints::SECTION_BUDGET / 1024
    );
    table_header(columns, "active orgs", "target");
    for &n in counts {
        let mut cells = Vec::new();
        for (i, column) in columns.iter().enumerate() {
            let sub = dir.join(format!("p9b-ckpt-{n}-{i}"));
            let store = column.store(&sub, n as u64)?;
            let replica = Replica::open(store, "", Settings::default()).await?;
            cells.push(checkpoints::one_row(&replica, n, ticks).await?);
        }
        row(
            &format!("{n}"),
            &cells,
            "≤ 0.1 req/ack including checkpoints, ≤ $0.50 per M acks",
        );
    }
    Ok(())
}

/// P9b's crash takeover row.
async fn takeover_table(dir: &Path, quick: bool, columns: &[Column]) -> BenchResult<()> {
    let n = if quick { 100 } else { 1_000 };
    outln!();
    outln!(
        "P9b crash takeover: a dead writer's run of {n} orgs (each a checkpoint and two journaled commits); the successor seals it, walks and installs every org (as many at a time as the row says), attaches each and acknowledges with one batch"
    );
    table_header(columns, "measure", "target");
    for concurrency in takeover::TAKEOVER_CONCURRENCY {
        let mut cells = Vec::new();
        for (i, column) in columns.iter().enumerate() {
            let sub = dir.join(format!("p9b-takeover-{n}-{concurrency}-{i}"));
            cells.push(takeover::one_cell(&sub, column, n, concurrency).await?);
        }
        row(
            &format!("takeover of {n} orgs, {concurrency} at a time"),
            &cells,
            "one seal fences all; every org acked ≤ lease + 1 s after the judgement",
        );
    }
    Ok(())
}

/// One org's commit: page 2 of a two-page database, zeros but for 100 bytes of `seed`.
fn commit(seed: u64, commit: u64) -> BenchResult<Delta> {
    let mut page = vec![0u8; 4096];
    for (j, b) in page.iter_mut().take(100).enumerate() {
        *b = (seed.wrapping_mul(31).wrapping_add(commit * 7 + j as u64) % 251) as u8;
    }
    Ok(Delta::new(4096, 2, BTreeMap::from([(2, page)]), commit)?)
}

/// `ticks` batches of a run over `n` orgs; the cell: acks/s, ack p50 / p99, requests per
/// ack, PUT dollars per million acks, mean batch size.
async fn one_row(replica: &Replica, n: usize, ticks: usize) -> BenchResult<String> {
    let instance = replica.instance().to_owned();
    let mut run = Run::new(RunName::new(&instance, 1)?, "bench", WINDOW)?;
    let orgs = (0..n)
        .map(|i| OrgId::new(&format!("org-{i:05}")))
        .collect::<Result<Vec<_>, _>>()?;
    for o in &orgs {
        run.attach(o, 1)?;
    }
    // Orgs whose commit is waiting for a batch, and when it was made.
    let mut waiting: Vec<usize> = (0..n).collect();
    let mut made = vec![Instant::now(); n];
    let mut next_commit = vec![1u64; n];
    let index: BTreeMap<OrgId, usize> = orgs.iter().cloned().zip(0..).collect();
    let mut latencies = Vec::with_capacity(n * ticks);
    let mut in_flight = FuturesUnordered::new();
    let (mut issued, mut bytes) = (0usize, 0usize);
    let before = replica.store_requests();
    let started = Instant::now();
    loop {
        while issued < ticks && !waiting.is_empty() && run.room() > 0 {
            let sections = waiting
                .drain(..)
                .map(|i| {
                    Ok(SectionInput {
                        org: orgs[i].clone(),
                        via: Via::Claim { seq: 1 },
                        base: Base {
                            seq: 1,
                            checksum: "bench".into(),
                        },
                        checksum: format!("{i}-{}", next_commit[i]),
                        pages: commit(i as u64, next_commit[i])?,
                        released: false,
                    })
                })
                .collect::<BenchResult<Vec<_>>>()?;
            let batch = replica
                .issue_batch(&mut run, sections, BatchMeta::new(1))
                .await?;
            bytes += batch.len();
            issued += 1;
            in_flight.push(async move {
                let landing = replica.land_batch(&batch).await;
                (batch, landing)
            });
        }
        let Some((batch, landing)) = in_flight.next().await else {
            break;
        };
        for (o, _) in run.settle(batch, landing)? {
            let i = index[&o];
            latencies.push(made[i].elapsed());
            next_commit[i] += 1;
            made[i] = Instant::now();
            waiting.push(i);
        }
        if run.needs_seal() {
            return Err("a batch failed on the bench's store".into());
        }
    }
    let cost = replica.store_requests().since(&before);
    Ok(format!(
        "{}, {} KB/batch",
        ack_cell(&mut latencies, started.elapsed(), &cost),
        bytes / issued.max(1) / 1000
    ))
}

/// A cell's common part: acks/s, ack p50 / p99, store requests per ack and PUT dollars per
/// million acks (S3 Standard's $5 per million PUTs). P9c's cells reuse it.
pub(crate) fn ack_cell(
    latencies: &mut [std::time::Duration],
    wall: std::time::Duration,
    cost: &idem_replica::StoreRequests,
) -> String {
    let acks = latencies.len().max(1);
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len().max(1) - 1) as f64 * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    let per_ack = cost.total() as f64 / acks as f64;
    let put_dollars = cost.put as f64 / acks as f64 * 5.0;
    format!(
        "{:.0} acks/s, {} / {}, {per_ack:.4} req/ack, ${put_dollars:.3}/M",
        acks as f64 / wall.as_secs_f64().max(1e-9),
        ms(at(0.5)),
        ms(at(0.99)),
    )
}
