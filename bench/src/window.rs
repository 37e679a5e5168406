//! P11: the point-in-time window (`docs/design.md` 2d). One org writes a row every few
//! seconds of a simulated day (a manual clock, so a day takes seconds), with a full snapshot
//! every hour as the ship policy takes one; then compaction and retention run as the org
//! layer runs them, once with level files and once without, and the table shows what the
//! window stores per org-day and what a restore of a random moment reads.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_org::object_store::ObjectStore;
use idem_org::replica::{
    Clock, Delta, ManualClock, OrgId, Replica, Retention, Settings, Snapshot, SystemClock,
};
use idem_org::rusqlite::{Connection, MAIN_DB};
use idem_replica::StoreRequests;
use idem_replica::latency::{LatencyStore, Op, Shapes};

use super::{BenchResult, ms, quantile};

const MINUTE: u64 = 60_000;
const HOUR: u64 = 60 * MINUTE;

/// What one policy left in the store and what its restores read.
struct Outcome {
    objects: BTreeMap<&'static str, (u64, u64)>,
    compaction: StoreRequests,
    /// Per restore: requests other than segment GETs, segment GETs, round trips on the
    /// critical path (all on the S3-shaped store).
    reads: Vec<(u64, u64, u64)>,
    times: Vec<Duration>,
    /// Requests of each `position_at_time` before a restore.
    lookups: Vec<u64>,
}

/// Prints the P11 table: `hours` simulated hours of one write every `gap_ms`.
pub async fn run(dir: &Path, quick: bool) -> BenchResult<()> {
    // Quick: a shorter history and fewer restores, each still of a moment older than an hour.
    let (hours, gap_ms, restores) = if quick {
        (3, 30_000, 8)
    } else {
        (24, 10_000, 30)
    };
    let history = History {
        hours,
        gap_ms,
        restores,
    };
    let with = simulate(dir, "levels", &history, Retention::default()).await?;
    let without = simulate(
        dir,
        "no-levels",
        &history,
        Retention {
            level_ms: 0,
            ..Retention::default()
        },
    )
    .await?;
    let scale = 24.0 / hours as f64;
    outln!(
        "\nP11 the point-in-time window: one org, a ~300 B row written every {} s for {hours} simulated hours, a full snapshot an hour; figures per org-day (x{scale:.0})",
        gap_ms / 1000
    );
    outln!(
        "| measure | level files (1 min buckets, deltas kept 1 h) | no level files (every delta kept for the window) | target |"
    );
    outln!("|---|---|---|---|");
    let stored = |o: &Outcome, kind: &str| {
        let (n, b) = o.objects.get(kind).copied().unwrap_or((0, 0));
        format!(
            "{:.0} objects, {:.1} KB",
            n as f64 * scale,
            b as f64 * scale / 1e3
        )
    };
    for kind in [
        "log entries",
        "snapshot objects",
        "delta blobs",
        "level files",
    ] {
        outln!(
            "| stored per org-day: {kind} | {} | {} |  |",
            stored(&with, kind),
            stored(&without, kind)
        );
    }
    let total = |o: &Outcome| {
        let (n, b) = o
            .objects
            .values()
            .fold((0, 0), |(n, b), (n2, b2)| (n + n2, b + b2));
        format!(
            "{:.0} objects, {:.1} KB",
            n as f64 * scale,
            b as f64 * scale / 1e3
        )
    };
    outln!(
        "| stored per org-day: all | {} | {} | what the window needs and nothing more |",
        total(&with),
        total(&without)
    );
    let reads = |o: &Outcome, pick: fn(&(u64, u64, u64)) -> u64| {
        p50_max(o.reads.iter().map(pick).collect())
    };
    outln!(
        "| restore of a random moment older than an hour: requests besides segments (LISTs, log entries, manifest, level file, deltas) | {} | {} | ≤ 16 objects plus segments |",
        reads(&with, |r| r.0),
        reads(&without, |r| r.0)
    );
    outln!(
        "| its segment GETs (the snapshot's 256 KiB segments) | {} | {} |  |",
        reads(&with, |r| r.1),
        reads(&without, |r| r.1)
    );
    outln!(
        "| its round trips on the critical path | {} | {} |  |",
        reads(&with, |r| r.2),
        reads(&without, |r| r.2)
    );
    let lookups = |o: &Outcome| p50_max(o.lookups.clone());
    outln!(
        "| finding the position of the moment first (position_at_time reads the log once): requests | {} | {} |  |",
        lookups(&with),
        lookups(&without)
    );
    let times = |o: &Outcome| {
        let mut t = o.times.clone();
        t.sort_unstable();
        format!(
            "p50 {}, p99 {}",
            ms(quantile(&t, 0.5)),
            ms(quantile(&t, 0.99))
        )
    };
    outln!(
        "| its wall time on S3-shaped latency (28 ms p50 a request) | {} | {} |  |",
        times(&with),
        times(&without)
    );
    let c = &with.compaction;
    outln!(
        "| compaction per org-day: PUTs, GETs, LISTs | {:.0}, {:.0}, {:.0} | none |  |",
        c.put as f64 * scale,
        c.get as f64 * scale,
        c.list as f64 * scale
    );
    outln!(
        "| Litestream's defaults, beside (not measured: its documented levels) | L1 30 s, L2 5 min, L3 1 h, a snapshot a day kept a day: a restore reads a snapshot and up to 23 + 11 + 9 level files plus L0 | | |"
    );
    Ok(())
}

/// What [`simulate`] writes and reads: `hours` simulated hours of one write every `gap_ms`,
/// then `restores` restores.
struct History {
    hours: u64,
    gap_ms: u64,
    restores: usize,
}

/// Writes the history on a fresh store under `dir/<name>`, compacts, thins with `policy`
/// at the real time, and restores `history.restores` random moments older than an hour.
async fn simulate(
    dir: &Path,
    name: &str,
    history: &History,
    policy: Retention,
) -> BenchResult<Outcome> {
    let (hours, gap_ms) = (history.hours, history.gap_ms);
    let work = dir.join(format!("p11-{name}"));
    let _ = std::fs::remove_dir_all(&work);
    let store: Arc<dyn ObjectStore> = Arc::new(idem_org::object_store::memory::InMemory::new());
    let now = SystemClock.now_ms();
    let start = now - (hours + 2) * HOUR;
    let clock = Arc::new(ManualClock::new(start));
    let replica =
        Replica::open_with(store.clone(), "", Settings::default(), clock.clone(), None).await?;
    let org = OrgId::new("acme")?;
    let mut claim = replica.claim(&org, "bench", false).await?;
    let mut conn = Connection::open_in_memory()?;
    conn.execute_batch(
        "PRAGMA page_size = 4096; CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB);
         WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 300)
         INSERT INTO t SELECT i, randomblob(300) FROM c",
    )?;
    let mut prev = image(&mut conn)?;
    let mut commit = 1;
    replica
        .ship(&mut claim, Snapshot::from_bytes(prev.clone(), commit))
        .await?;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next_rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut moments = Vec::new();
    for _ in 0..hours {
        for _ in 0..HOUR / gap_ms {
            clock.advance(gap_ms);
            // Half the writes update a row, half append one.
            let r = next_rand();
            if r % 2 == 0 {
                conn.execute(
                    "UPDATE t SET v = randomblob(300) WHERE id = ?1",
                    [i64::try_from(1 + (r >> 8) % 300)?],
                )?;
            } else {
                conn.execute("INSERT INTO t (v) VALUES (randomblob(300))", [])?;
            }
            let next = image(&mut conn)?;
            commit += 1;
            replica
                .ship_delta(&mut claim, diff(&prev, &next, commit)?)
                .await?;
            prev = next;
            moments.push(clock.now_ms());
        }
        commit += 1;
        replica
            .ship(&mut claim, Snapshot::from_bytes(prev.clone(), commit))
            .await?;
    }
    clock.set(SystemClock.now_ms());
    let before = replica.store_requests();
    replica.compact_levels(&org, &policy).await?;
    let compaction = replica.store_requests().since(&before);
    replica.retain(&org, &policy).await?;
    let mut objects: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    let listed: Vec<_> = futures::TryStreamExt::try_collect(store.list(None)).await?;
    for m in &listed {
        let path = m.location.as_ref();
        let kind = if path.contains("/log/") {
            "log entries"
        } else if path.contains("/levels/") {
            "level files"
        } else if path.ends_with(".delta.zst") {
            "delta blobs"
        } else if path.contains("/snap/") {
            "snapshot objects"
        } else {
            continue;
        };
        let e = objects.entry(kind).or_default();
        *e = (e.0 + 1, e.1 + m.size);
    }
    // The restores read through an S3-shaped store over the same objects (the history
    // itself was written without delay: only what a restore reads is timed).
    let shaped = Arc::new(LatencyStore::new(store.clone(), Shapes::s3(), 11));
    let reader = Replica::open(shaped.clone(), "", Settings::default()).await?;
    let (mut reads, mut times, mut lookups) = (Vec::new(), Vec::new(), Vec::new());
    std::fs::create_dir_all(&work)?;
    let old = moments
        .iter()
        .copied()
        .filter(|m| *m + HOUR < clock.now_ms())
        .collect::<Vec<_>>();
    for i in 0..history.restores {
        let Some(at) = old.get((next_rand() as usize) % old.len().max(1)).copied() else {
            break;
        };
        let trace = shaped.trace();
        let seq = reader.position_at_time(&org, at).await?;
        lookups.push(trace.finish().requests.len() as u64);
        let dest = work.join(format!("restore-{i}.db"));
        let trace = shaped.trace();
        let t = Instant::now();
        reader.restore(&org, Some(seq), &dest).await?;
        times.push(t.elapsed());
        let done = trace.finish();
        let segments = done
            .requests
            .iter()
            .filter(|r| r.op == Op::Get && r.path.ends_with(".seg.zst"))
            .count() as u64;
        reads.push((
            done.requests.len() as u64 - segments,
            segments,
            done.depth() as u64,
        ));
        let _ = std::fs::remove_file(&dest);
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(Outcome {
        objects,
        compaction,
        reads,
        times,
        lookups,
    })
}

/// "p50 A, max B" of `values`.
fn p50_max(mut values: Vec<u64>) -> String {
    values.sort_unstable();
    let q = |f: f64| {
        let i = ((values.len() as f64 - 1.0) * f) as usize;
        values.get(i).copied().unwrap_or(0)
    };
    format!("p50 {}, max {}", q(0.5), q(1.0))
}

/// The database's exact bytes.
fn image(conn: &mut Connection) -> BenchResult<Vec<u8>> {
    Ok(conn.serialize(MAIN_DB)?.to_vec())
}

/// The pages of `next` that differ from `prev`, as a delta to `next`'s size.
pub(crate) fn diff(prev: &[u8], next: &[u8], commit: u64) -> BenchResult<Delta> {
    const PS: usize = 4096;
    let mut pages = BTreeMap::new();
    for (i, page) in next.chunks(PS).enumerate() {
        if prev.get(i * PS..(i + 1) * PS) != Some(page) {
            pages.insert(i as u32 + 1, page.to_vec());
        }
    }
    Ok(Delta::new(
        PS as u32,
        (next.len() / PS) as u32,
        pages,
        commit,
    )?)
}
