//! P9b's crash takeover (`docs/design.md` 3g, K2): a dead writer's run holds N orgs, each
//! with a checkpoint and two journaled commits. A successor places one adopt seal, learns
//! the orgs from the run's roster (K2.3), walks each org (K0) and installs its state
//! (`restore_walk`), attaches each (K4), and acknowledges with one batch. Measured on the
//! store column: the seal, the whole takeover, each org's hydrate (objects read, time).
//!
//! The dead writer's state is set up on the plain local directory under the column's store
//! (claims created directly, no announcements: set-up, not measured). The successor's
//! lease judgement of the dead writer (a whole watch, I15) is not in these times.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use idem_org::rusqlite::Connection;
use idem_replica::journal::{
    Adoption, Base, BatchMeta, Checkpoint, CheckpointHeader, EntryCreated, FreePoint, JournalClaim,
    Run, SectionInput, Via, image_checksum,
};
use idem_replica::{Delta, OrgId, Replica, Settings, Snapshot};

use crate::p10::Column;
use crate::{BenchResult, ms};

/// Orgs the dead writer's setup writes at once.
const CONCURRENCY: usize = 64;

/// Orgs walked and installed at once by the successor, one row each: a registry acquires
/// every org a request asks for at once, so the wider row is its shape; the narrower
/// shows the cost in sequential round trips per org.
pub(crate) const TAKEOVER_CONCURRENCY: [usize; 2] = [64, 512];

/// Canonical images of one org's database after 0, 1 and 2 commits.
fn images() -> BenchResult<Vec<Vec<u8>>> {
    let conn = Connection::open_in_memory()?;
    conn.execute_batch("PRAGMA page_size = 4096; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);")?;
    let mut out = Vec::new();
    for c in 0..3u64 {
        if c > 0 {
            conn.execute(
                "INSERT INTO t VALUES (?1, zeroblob(300))",
                idem_org::rusqlite::params![c as i64],
            )?;
        }
        out.push(Snapshot::take(&conn, |_| Ok(c))?.bytes().to_vec());
    }
    Ok(out)
}

/// The pages of `next` that differ from `prev`, as a delta holding `commit`.
fn diff(prev: &[u8], next: &[u8], commit: u64) -> BenchResult<Delta> {
    let mut pages = BTreeMap::new();
    for (i, page) in next.chunks(4096).enumerate() {
        if prev.get(i * 4096..(i + 1) * 4096) != Some(page) {
            pages.insert(i as u32 + 1, page.to_vec());
        }
    }
    Ok(Delta::new(4096, (next.len() / 4096) as u32, pages, commit)?)
}

/// Sets up the dead writer in `dir`: `n` orgs claimed into its run, checkpointed, two
/// commits of each journaled. Returns its run.
async fn dead_writer(dir: &Path, orgs: &[OrgId], imgs: &[Vec<u8>]) -> BenchResult<Run> {
    let a = Replica::open(Replica::local_store(dir)?, "", Settings::default()).await?;
    let mut run = a.start_run("dead", 4).await?;
    let meta = BatchMeta {
        roster: Some(orgs.to_vec()),
        ..BatchMeta::new(1)
    };
    let batch = a.issue_batch(&mut run, Vec::new(), meta).await?;
    let landing = a.land_batch(&batch).await;
    run.settle(batch, landing)?;
    let name = run.name().clone();
    futures::stream::iter(orgs.iter().map(|o| {
        let (a, name, base) = (&a, name.clone(), imgs[0].clone());
        async move {
            let claim = JournalClaim {
                seq: 1,
                round: 1,
                writer: "dead".into(),
                run: name.clone(),
                from: 1,
                after: Some(FreePoint::Empty),
            };
            let checkpoint = Checkpoint {
                header: CheckpointHeader {
                    seq: 2,
                    round: 1,
                    writer: "dead".into(),
                    run: name,
                    through: 1,
                    tenure: Via::Claim { seq: 1 },
                    released: false,
                },
                snapshot: Snapshot::from_bytes(base, 0),
            };
            for created in [
                a.create_journal_claim(o, claim).await?,
                a.create_checkpoint(o, checkpoint).await?,
            ] {
                if let EntryCreated::Taken(e) = created {
                    return Err(format!("{o}: set-up entry taken: {e:?}").into());
                }
            }
            BenchResult::Ok(())
        }
    }))
    .buffer_unordered(CONCURRENCY)
    .try_collect::<Vec<()>>()
    .await?;
    for o in orgs {
        run.attach(o, 1)?;
    }
    let base = Base {
        seq: 2,
        checksum: image_checksum(&imgs[0])?,
    };
    for commit in 1..=2u64 {
        let sections = orgs
            .iter()
            .map(|o| {
                Ok(SectionInput {
                    org: o.clone(),
                    via: Via::Claim { seq: 1 },
                    base: base.clone(),
                    checksum: image_checksum(&imgs[commit as usize])?,
                    pages: diff(&imgs[0], &imgs[commit as usize], commit)?,
                    released: false,
                })
            })
            .collect::<BenchResult<Vec<_>>>()?;
        let batch = a.issue_batch(&mut run, sections, BatchMeta::new(1)).await?;
        let landing = a.land_batch(&batch).await;
        if run.settle(batch, landing)?.len() != orgs.len() {
            return Err("set-up batch not acknowledged".into());
        }
    }
    Ok(run)
}

/// One cell: the takeover of `n` orgs on `column`'s store.
pub(crate) async fn one_cell(
    dir: &Path,
    column: &Column,
    n: usize,
    concurrency: usize,
) -> BenchResult<String> {
    let imgs = images()?;
    let orgs = (0..n)
        .map(|i| OrgId::new(&format!("org-{i:05}")))
        .collect::<Result<Vec<_>, _>>()?;
    let dead = dead_writer(dir, &orgs, &imgs).await?;
    let b = Replica::open(column.store(dir, n as u64)?, "", Settings::default()).await?;
    let installs = tempfile::tempdir()?;
    let before = b.store_requests();
    let started = Instant::now();
    let mut run = b.start_run("successor", 4).await?;
    let Adoption::Sealed { slot, listing, .. } = b
        .adopt_run(dead.name(), "successor", run.name(), run.floor())
        .await?
    else {
        return Err("the dead writer's run was not sealed".into());
    };
    let sealed = started.elapsed();
    let learned = b.run_orgs(&listing, slot).await?;
    let after_seal = b.store_requests();
    let walked: Vec<(OrgId, _, Duration)> = futures::stream::iter(learned.orgs.iter().map(|o| {
        let (b, dest) = (&b, installs.path().join(format!("{o}.db")));
        async move {
            let t = Instant::now();
            let walk = b.walk_org(o).await?;
            if b.restore_walk(o, &walk, &dest).await? != Some(2) {
                return Err(format!("{o}: not the acknowledged commit").into());
            }
            BenchResult::Ok((o.clone(), walk, t.elapsed()))
        }
    }))
    .buffer_unordered(concurrency)
    .try_collect()
    .await?;
    let hydrates = b.store_requests().since(&after_seal);
    let mut per_org: Vec<Duration> = walked.iter().map(|(_, _, d)| *d).collect();
    for (o, walk, _) in walked {
        if b.attach_own(&o, walk, &mut run)?.is_none() {
            return Err(format!("{o}: its walk does not end in the successor's run").into());
        }
    }
    let batch = b
        .issue_batch(&mut run, Vec::new(), BatchMeta::new(1))
        .await?;
    let landing = b.land_batch(&batch).await;
    run.settle(batch, landing)?;
    let all = started.elapsed();
    let total = b.store_requests().since(&before);
    per_org.sort_unstable();
    let at = |q: f64| per_org[((per_org.len() - 1) as f64 * q) as usize];
    Ok(format!(
        "seal {}, all {} attached and acked {}, {:.1} req/org; hydrate p50 {} / p99 {}, {:.1} GET + {:.1} LIST per org",
        ms(sealed),
        learned.orgs.len(),
        ms(all),
        total.total() as f64 / n as f64,
        ms(at(0.5)),
        ms(at(0.99)),
        hydrates.get as f64 / n as f64,
        hydrates.list as f64 / n as f64,
    ))
}
