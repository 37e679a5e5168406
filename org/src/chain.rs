//! One ship: capture on the writer thread, then publish a delta of the committed WAL frames
//! since the previous ship, or a full snapshot when the chain must restart (I6, I10).
//!
//! A full snapshot is shipped when the claim has none yet (a new writer), when the WAL
//! position of the chain is lost (a failed full ship, a WAL restarted behind our back), and
//! when the deltas since the last full snapshot outgrow [`Settings::delta_budget_percent`] of
//! it, number [`Settings::max_deltas`], or are older than
//! [`Settings::snapshot_interval_ms`]: this bounds what a hydrate downloads and applies.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use idem_replica::{Claim, Delta, Replica, Snapshot};
use tokio::sync::oneshot;

use crate::capture::{self, CaptureError, Captured, Checkpoint};
use crate::owned::{Foreign, OwnedFiles};
use crate::ship::Shared;
use crate::wal::{self, WalPos};
use crate::writer::Job;
use crate::{Error, Settings};

/// Where the next delta capture starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WalState {
    /// Unknown: the next ship must be a full snapshot.
    Lost,
    /// A new WAL generation begins after a checkpoint emptied the file: read from offset 0.
    Fresh,
    /// After the last captured commit frame.
    At(WalPos),
}

/// Pages captured but not yet published: a delta whose ship failed is merged into the next.
struct Pending {
    pages: BTreeMap<u32, Vec<u8>>,
}

/// The shipping state of one claim, owned by whoever holds the org's ship lock.
pub(crate) struct ShipCtx {
    pub claim: Claim,
    wal: WalState,
    page_size: u32,
    db_pages: u32,
    pending: Option<Pending>,
    full_bytes: u64,
    since_full_bytes: u64,
    since_full_deltas: u64,
    full_at: Instant,
    /// Pages changed since the chain's snapshot (shipped or pending): a compacted delta
    /// carries them all.
    changed: std::collections::BTreeSet<u32>,
    /// Deltas, and their compressed bytes, since the last compaction (or snapshot).
    window_deltas: u64,
    window_bytes: u64,
    /// Database pages in the last full snapshot (with `full_bytes`: bytes per stored page).
    full_pages: u64,
    /// Published content of pages shipped in this chain's deltas: the base a later delta
    /// encodes a page against (spans or a zstd patch). Exactly the chain tip's content for
    /// each page it holds; at most `Settings::delta_cache_pages` pages.
    published: std::collections::HashMap<u32, Vec<u8>>,
    /// The commit counter the last capture proved from its pages: a capture whose new frames
    /// do not touch the counter must hold exactly this one.
    proven: Option<u64>,
}

impl ShipCtx {
    pub fn new(claim: Claim) -> ShipCtx {
        ShipCtx {
            claim,
            wal: WalState::Lost,
            page_size: 0,
            db_pages: 0,
            pending: None,
            full_bytes: 0,
            since_full_bytes: 0,
            since_full_deltas: 0,
            full_at: Instant::now(),
            changed: std::collections::BTreeSet::new(),
            window_deltas: 0,
            window_bytes: 0,
            full_pages: 0,
            published: std::collections::HashMap::new(),
            proven: None,
        }
    }

    fn wants_full(&self, s: &Settings) -> bool {
        self.claim.chain_tip().is_none()
            || self.wal == WalState::Lost
            || self.since_full_bytes.saturating_mul(100)
                > self.full_bytes.saturating_mul(s.delta_budget_percent)
            || self.since_full_deltas >= s.max_deltas
            || (s.snapshot_interval_ms > 0
                && self.full_at.elapsed().as_millis() as u64 >= s.snapshot_interval_ms)
    }

    /// A compaction is due after `compact_every_deltas` deltas, and worth it only while its
    /// estimated size — the pages changed since the snapshot, at the last snapshot's stored
    /// bytes per page (whole pages: a compaction cannot XOR-encode) — is at most a quarter of
    /// what the deltas since the last compaction shipped, or at most [`COMPACTION_FLOOR`]:
    /// bytes per acknowledgement then grow by at most a quarter (or about 1 KiB per delta
    /// when deltas are tiny), and a hydrate reads the snapshot, it and the deltas after it
    /// instead of the whole chain. A database that grows or changes everywhere fails the test
    /// and keeps its chain until the budget ships a full snapshot.
    fn wants_compaction(&self, s: &Settings) -> bool {
        let per_page = self.full_bytes / self.full_pages.max(1);
        let estimate = (self.changed.len() as u64).saturating_mul(per_page);
        s.compact_every_deltas > 0
            && self.window_deltas >= s.compact_every_deltas
            && estimate <= (self.window_bytes / 4).max(COMPACTION_FLOOR)
    }
}

/// A compaction this small (estimated stored bytes) is always worth the objects it saves a
/// hydrate, whatever the deltas it supersedes weighed.
const COMPACTION_FLOOR: u64 = 64 << 10;

/// What a ship needs besides its context.
pub(crate) struct ShipIo<'a> {
    pub shared: &'a Shared,
    pub replica: &'a Replica,
    /// The writer's job queue; never holds the sender across an await (a held
    /// `Sender<Job>` trips rustc's higher-ranked `Send` check in callers).
    pub jobs: &'a Mutex<Option<Sender<Job>>>,
    /// The writer's database and WAL, read through descriptors it owns (I13).
    pub files: &'a Arc<OwnedFiles>,
    pub settings: &'a Settings,
}

/// Asks the writer thread for a capture and waits for it.
async fn capture(io: &ShipIo<'_>, from: u64, checkpoint: Checkpoint) -> Result<Captured, Failure> {
    let (tx, rx) = oneshot::channel();
    let sent = crate::org::send_job(
        io.jobs,
        Job::Capture {
            from,
            checkpoint,
            reply: tx,
        },
    );
    let got = if sent { rx.await.ok() } else { None };
    match got {
        Some(Ok(c)) => Ok(c),
        Some(Err(e)) => Err(capture_error(io, e)),
        None => Err(capture_error(
            io,
            CaptureError::Io(std::io::Error::other("the writer thread has stopped")),
        )),
    }
}

/// A capture's failure as a ship failure: a local I/O error fails the ship like a store
/// error would (retryable); a foreign change poisons the org.
fn capture_error(io: &ShipIo<'_>, e: CaptureError) -> Failure {
    match e {
        CaptureError::Io(source) => Failure::Store(idem_replica::Error::Io {
            path: io.files.db_path().display().to_string(),
            source,
        }),
        CaptureError::Foreign(f) => Failure::Foreign(f),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f).await.map_err(|source| {
        Failure::Store(idem_replica::Error::Task {
            op: "preparing a ship",
            source,
        })
    })
}

/// Checks a capture against its own pages (I13): the newest captured version of the
/// counter page holds `cap_commit`, or, when the new frames leave that page alone, the
/// counter is the one the previous capture proved.
fn prove(
    counter: Option<&[u8]>,
    counter_page: u32,
    cap_commit: u64,
    previous: Option<u64>,
) -> Result<(), Foreign> {
    let found = match counter {
        Some(page) => Some(
            crate::proof::commit_counter(page, counter_page).map_err(|e| {
                Foreign(format!("the captured counter page is not the counter: {e}"))
            })?,
        ),
        None => previous,
    };
    match found {
        Some(n) if n == cap_commit => Ok(()),
        Some(n) => Err(Foreign(format!(
            "the captured pages hold commit {n}, the writer committed {cap_commit}"
        ))),
        None => Err(Foreign(format!(
            "the captured pages do not show commit {cap_commit}"
        ))),
    }
}

/// Ships everything committed so far and settles the waiters it covers.
///
/// # Errors
/// The capture's or the replica's error; `Fenced`/unknown outcomes have already stopped the
/// org when this returns, and other failures have failed the waiters the ship would have
/// acknowledged (they retry; their commits ship with a later ship).
pub(crate) async fn ship_once(ctx: &mut ShipCtx, io: &ShipIo<'_>) -> Result<(), Error> {
    let start = io.shared.lock().begin();
    let covering = io.shared.committed.load(Ordering::SeqCst);
    let shipped = if ctx.wants_full(io.settings) {
        ship_full(ctx, io).await
    } else {
        match ship_delta(ctx, io).await {
            Err(Fallback::Full) => ship_full(ctx, io).await,
            Err(Fallback::Failed(e)) => Err(e),
            Ok(v) => Ok(v),
        }
    };
    let (commit, bytes, full) = match shipped {
        Ok(v) => v,
        Err(Failure::Store(e)) => return Err(io.shared.failed(start, covering, e)),
        Err(Failure::Foreign(f)) => return Err(io.shared.poison(&f.0)),
    };
    let c = &io.shared.counters;
    c.ships.fetch_add(1, Ordering::Relaxed);
    if full {
        c.full_ships.fetch_add(1, Ordering::Relaxed);
        c.full_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    c.bytes_shipped.fetch_add(bytes, Ordering::Relaxed);
    let done = io.shared.lock().succeed(start, commit);
    tracing::debug!(org = %io.shared.org, round = io.shared.round, commit, full, bytes, acks = done.len(), "shipped");
    for w in done {
        let _ = w.tx.send(Ok(()));
    }
    Ok(())
}

/// Why a ship failed.
enum Failure {
    /// The store's error, or a local failure carried as the replica's `Io`/`Task` error.
    Store(idem_replica::Error),
    /// The org's files were changed by someone else: nothing may be published.
    Foreign(Foreign),
}

impl From<idem_replica::Error> for Failure {
    fn from(e: idem_replica::Error) -> Self {
        Failure::Store(e)
    }
}

enum Fallback {
    Full,
    Failed(Failure),
}

/// (commit shipped, compressed bytes uploaded, whether it was a full snapshot)
type Done = (u64, u64, bool);

async fn ship_full(ctx: &mut ShipCtx, io: &ShipIo<'_>) -> Result<Done, Failure> {
    ctx.wal = WalState::Lost;
    ctx.pending = None;
    ctx.published.clear();
    let cap = capture(io, 0, Checkpoint::Before).await?;
    let files = io.files.clone();
    let built = blocking(move || {
        let frames = wal::read(&cap.head, &cap.tail, None)
            .map_err(|e| Foreign(format!("the WAL cannot be read: {}", e.0)))?;
        let image = capture::image(&files, cap.db, cap.page_size, &frames)?;
        let ps = cap.page_size as usize;
        let at = (cap.counter_page as usize).saturating_sub(1) * ps;
        prove(image.get(at..at + ps), cap.counter_page, cap.commit, None)?;
        Ok::<_, CaptureError>((image, cap.page_size, frames.end, cap.commit))
    })
    .await?;
    let (image, page_size, end, commit) = built.map_err(|e| capture_error(io, e))?;
    ctx.proven = Some(commit);
    let db_pages = (image.len() / page_size as usize) as u32;
    let shipped = io
        .replica
        .ship(&mut ctx.claim, Snapshot::from_bytes(image, commit))
        .await?;
    ctx.wal = end.map_or(WalState::Fresh, WalState::At);
    ctx.page_size = page_size;
    ctx.db_pages = db_pages;
    ctx.full_bytes = shipped.compressed_bytes;
    ctx.since_full_bytes = 0;
    ctx.since_full_deltas = 0;
    ctx.changed.clear();
    ctx.window_deltas = 0;
    ctx.window_bytes = 0;
    ctx.full_pages = u64::from(db_pages);
    ctx.full_at = Instant::now();
    Ok((commit, shipped.compressed_bytes, true))
}

async fn ship_delta(ctx: &mut ShipCtx, io: &ShipIo<'_>) -> Result<Done, Fallback> {
    let from = match ctx.wal {
        WalState::At(pos) => Some(pos),
        WalState::Fresh => None,
        WalState::Lost => return Err(Fallback::Full),
    };
    // A compaction reads pages from the database file, so it checkpoints every time: after
    // it the file holds exactly the captured state, and stays so until the next capture.
    let compact = ctx.wants_compaction(io.settings);
    let bound = if compact {
        0
    } else {
        io.settings.wal_checkpoint_bytes
    };
    let cap = match capture(
        io,
        from.map_or(0, |p| p.offset),
        Checkpoint::AfterIfOver(bound),
    )
    .await
    {
        Ok(cap) => cap,
        Err(e) => {
            // A capture that failed may have checkpointed first: the position is ours but
            // unknown, so the next ship is a full snapshot (never a read of a moved WAL).
            ctx.wal = WalState::Lost;
            return Err(Fallback::Failed(e));
        }
    };
    let (commit, reset, db_state) = (cap.commit, cap.reset, cap.db);
    let previous = ctx.proven;
    let frames = blocking(move || {
        // Only this writer restarts its WAL, and it tracks where: frames that cannot be
        // read from the chain's position mean someone else rewrote the WAL.
        let frames = wal::read(&cap.head, &cap.tail, from).map_err(|e| {
            Foreign(format!(
                "the WAL cannot be read from the chain's position: {}",
                e.0
            ))
        })?;
        let counter = frames.pages.get(&cap.counter_page).map(Vec::as_slice);
        prove(counter, cap.counter_page, cap.commit, previous)?;
        Ok::<_, Foreign>(frames)
    })
    .await
    .map_err(Fallback::Failed)?
    .map_err(|f| Fallback::Failed(Failure::Foreign(f)))?;
    ctx.proven = Some(commit);
    if let Some(pos) = frames.end
        && pos.page_size != ctx.page_size
    {
        return Err(Fallback::Full);
    }
    // Every committed frame is now in `pending`; the WAL may be reset behind it.
    ctx.wal = if reset {
        WalState::Fresh
    } else {
        frames.end.map_or(ctx.wal, WalState::At)
    };
    if let Some(n) = frames.db_pages {
        ctx.db_pages = n;
    }
    let pending = ctx.pending.get_or_insert_with(|| Pending {
        pages: BTreeMap::new(),
    });
    pending.pages.extend(frames.pages);
    let db_pages = ctx.db_pages;
    pending.pages.retain(|p, _| *p <= db_pages);
    ctx.changed.retain(|p| *p <= db_pages);
    let delta = if compact && reset {
        match compacted_delta(ctx, io, commit, db_state).await {
            Ok(d) => d,
            Err(f @ Failure::Foreign(_)) => return Err(Fallback::Failed(f)),
            Err(Failure::Store(e)) => {
                tracing::warn!(org = %io.shared.org, error = ?e, "compaction failed; shipping a full snapshot");
                return Err(Fallback::Full);
            }
        }
    } else {
        let published = &ctx.published;
        Delta::new(ctx.page_size, db_pages, pending.pages.clone(), commit)
            .map_err(|e| Fallback::Failed(e.into()))?
            .encode_against(|p| published.get(&p).map(Vec::as_slice))
    };
    let compacted = delta.is_compacted();
    match io.replica.ship_delta(&mut ctx.claim, delta).await {
        Ok(shipped) => {
            if compacted {
                io.shared
                    .counters
                    .compactions
                    .fetch_add(1, Ordering::Relaxed);
                (ctx.window_deltas, ctx.window_bytes) = (0, 0);
            } else {
                ctx.window_deltas += 1;
                ctx.window_bytes += shipped.compressed_bytes;
            }
            if let Some(done) = ctx.pending.take() {
                ctx.changed.extend(done.pages.keys().copied());
                // The tip now holds these pages; pages past the end are gone from it.
                ctx.published.retain(|p, _| *p <= db_pages);
                // Beyond the bound the cache restarts with the newest pages: the pages changed
                // most recently are the ones most likely to change again.
                let cap = io.settings.delta_cache_pages;
                if ctx.published.len() + done.pages.len() > cap {
                    ctx.published.clear();
                }
                if done.pages.len() <= cap {
                    ctx.published.extend(done.pages);
                }
            }
            // The budget and the count bound what a hydrate reads: after a compaction that
            // is the compacted delta and what follows it.
            if compacted {
                (ctx.since_full_bytes, ctx.since_full_deltas) = (shipped.compressed_bytes, 1);
            } else {
                ctx.since_full_bytes += shipped.compressed_bytes;
                ctx.since_full_deltas += 1;
            }
            Ok((commit, shipped.compressed_bytes, false))
        }
        Err(idem_replica::Error::NoChainTip { .. }) => Err(Fallback::Full),
        // The store refused the delta as inconsistent with the chain (a compaction missing a
        // page changed since the snapshot, or a page encoded against content the tip does
        // not hold): nothing was published; a full snapshot restarts the chain, and the
        // page cache with it, instead of retrying the same delta.
        Err(e @ idem_replica::Error::InvalidSnapshot { .. }) => {
            tracing::warn!(org = %io.shared.org, error = %e, compacted, "delta refused; shipping a full snapshot");
            Err(Fallback::Full)
        }
        Err(e) => Err(Fallback::Failed(e.into())),
    }
}

/// Builds a compacted delta after a capture whose checkpoint emptied the WAL: every page
/// changed since the snapshot (pending ones included), read from the database file, which
/// now holds exactly the captured state.
async fn compacted_delta(
    ctx: &ShipCtx,
    io: &ShipIo<'_>,
    commit: u64,
    db: crate::owned::DbState,
) -> Result<Delta, Failure> {
    let mut wanted: Vec<u32> = ctx.changed.iter().copied().collect();
    if let Some(p) = &ctx.pending {
        wanted.extend(p.pages.keys().copied());
    }
    wanted.sort_unstable();
    wanted.dedup();
    let (files, ps, db_pages) = (io.files.clone(), ctx.page_size, ctx.db_pages);
    let read = blocking(move || capture::read_pages(&files, db, ps, db_pages, &wanted)).await?;
    let pages = read.map_err(|e| capture_error(io, e))?;
    Ok(Delta::new(ps, db_pages, pages, commit).map(Delta::compacted)?)
}
