//! Capturing what a ship publishes, on the writer thread, between two transactions.
//!
//! The writer thread is the only connection that writes (it holds the database exclusively,
//! see [`super::OwnedFiles`]), and `wal_autocheckpoint` is off, so between two of its jobs the WAL
//! holds exactly the commits up to the commit counter it last raised. A capture copies the
//! WAL bytes after the previous capture (a delta) or the whole WAL (a full snapshot, read
//! together with the database file) and that counter, so the shipper knows which commits it
//! ships (I6); the shipper then proves it from the captured pages (`super::proof`).
//!
//! Checkpoints run only here: a full capture checkpoints first (the database file is then
//! stable until the next capture, which the same shipper issues after it has read the file);
//! a delta capture checkpoints after copying, once every committed frame in the WAL is in
//! the copy, when the WAL has outgrown its bound. A copied frame whose delta then fails to
//! publish is kept by the shipper and shipped with the next delta, so a checkpoint never
//! loses a frame that no published entry holds.
//!
//! Before copying anything, a capture checks that nobody else touched the files since the
//! last one (I13): the names still lead to the writer's inodes, the database file is as the
//! writer's last checkpoint left it, and the WAL header is the generation the writer last saw
//! or one its own checkpoints restarted it into.

use std::collections::BTreeMap;
use std::time::Duration;

use rusqlite::Connection;

use std::sync::Arc;

use super::owned::{DbState, Foreign, OwnedFiles};
use super::wal::{self, Generation};

/// When a capture checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpoint {
    /// Before reading (full snapshots).
    Before,
    /// After reading, if the WAL is at least this many bytes (deltas).
    AfterIfOver(u64),
}

/// What a shipper asks the writer thread to capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureRequest {
    /// WAL offset to copy from (0 for the whole WAL).
    pub from: u64,
    /// When to checkpoint.
    pub checkpoint: Checkpoint,
}

/// Why a capture, or a read of the file it left, failed.
#[derive(Debug)]
pub enum CaptureError {
    /// A local I/O or SQLite failure: the ship fails, retryably.
    Io(std::io::Error),
    /// Someone else changed the org's files: the org is poisoned.
    Foreign(Foreign),
}

impl From<std::io::Error> for CaptureError {
    fn from(e: std::io::Error) -> Self {
        CaptureError::Io(e)
    }
}

impl From<Foreign> for CaptureError {
    fn from(f: Foreign) -> Self {
        CaptureError::Foreign(f)
    }
}

/// What a capture copied: handed to the shipper as is.
#[derive(Debug)]
pub struct Captured {
    /// The database's commit sequence at the capture: what the ship will acknowledge, once
    /// the captured pages prove it.
    pub(crate) commit: u64,
    /// The database's page size in bytes.
    pub(crate) page_size: u32,
    /// The root page of the table holding the commit sequence.
    pub(crate) counter_page: u32,
    /// The WAL file's first 32 bytes (empty when there is no WAL content).
    pub(crate) head: Vec<u8>,
    /// The WAL bytes from the requested offset to the end of the file.
    pub(crate) tail: Vec<u8>,
    /// True when a checkpoint after the copy emptied the WAL: the next capture starts a new
    /// WAL generation at offset 0.
    pub(crate) reset: bool,
    /// The database file as this capture left it: reads of it must find it so.
    pub(crate) db: DbState,
}

impl Captured {
    /// The commit sequence the capture holds: once a ship of it is published, every commit
    /// up to it is acknowledged (I6).
    pub fn commit(&self) -> u64 {
        self.commit
    }
}

/// What the writer thread remembers between captures to tell its own changes from others'.
#[derive(Debug)]
struct Watch {
    db: DbState,
    generation: Option<Generation>,
    /// A checkpoint of ours emptied the WAL since `generation` was seen.
    restarted: bool,
}

impl Watch {
    /// The files as the writer opened them.
    ///
    /// # Errors
    /// An I/O error, or [`Foreign`] for a damaged WAL header.
    fn new(files: &OwnedFiles) -> Result<Watch, CaptureError> {
        let mut watch = Watch {
            db: files.db_state()?,
            generation: None,
            restarted: false,
        };
        files.expect(watch.db);
        let head = read_head(files)?;
        watch.observe(&head)?;
        Ok(watch)
    }

    /// Checks a WAL header against the last one seen, then remembers it.
    fn observe(&mut self, head: &[u8]) -> Result<(), Foreign> {
        if head.is_empty() {
            return match self.generation {
                Some(_) if !self.restarted => Err(Foreign(
                    "the WAL was emptied outside the writer's checkpoints".into(),
                )),
                _ => Ok(()),
            };
        }
        let now = Generation::of(head)
            .map_err(|e| Foreign(format!("the WAL header is damaged: {}", e.0)))?;
        match self.generation {
            Some(seen) if seen == now => {}
            Some(seen) if self.restarted && seen.restarted_into(&now) => {}
            Some(_) => {
                return Err(Foreign(
                    "the WAL was restarted outside the writer's checkpoints".into(),
                ));
            }
            None => {}
        }
        self.generation = Some(now);
        self.restarted = false;
        Ok(())
    }
}

fn read_head(files: &OwnedFiles) -> std::io::Result<Vec<u8>> {
    let len = files.wal_len()?;
    files.read_wal(0, len.min(wal::HEADER as u64))
}

/// `PRAGMA wal_checkpoint(TRUNCATE)` without waiting: the writer thread must not block.
/// Records the database file as the checkpoint left it; returns true when the WAL is empty.
fn truncate_checkpoint(
    conn: &Connection,
    busy: Duration,
    files: &OwnedFiles,
    watch: &mut Watch,
) -> Result<bool, CaptureError> {
    let ran = conn.busy_timeout(Duration::ZERO).and_then(|()| {
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            r.get::<_, i64>(0)
        })
    });
    if let Err(e) = conn.busy_timeout(busy) {
        tracing::warn!(error = %e, "could not restore busy_timeout after a checkpoint");
    }
    if let Err(e) = ran {
        tracing::debug!(error = %e, "checkpoint skipped");
    }
    // Whether or not it finished, a checkpoint may have written the database file and
    // restarted the WAL's generation (the relation `restarted_into` checks stays strict).
    watch.restarted = true;
    watch.db = files.db_state()?;
    files.expect(watch.db);
    Ok(files.wal_len()? == 0)
}

/// The capturing side of the writer thread: the files, what was last seen of them, and the
/// connection's busy timeout (restored after each non-blocking checkpoint).
#[derive(Debug)]
pub(crate) struct Capturer {
    files: Arc<OwnedFiles>,
    watch: Watch,
    busy: Duration,
}

impl Capturer {
    pub(crate) fn new(files: Arc<OwnedFiles>, busy: Duration) -> Result<Capturer, CaptureError> {
        let watch = Watch::new(&files)?;
        Ok(Capturer { files, watch, busy })
    }

    pub(crate) fn files(&self) -> &Arc<OwnedFiles> {
        &self.files
    }

    /// [`super::Owned::checkpoint_to_file`]: the capture's checks, then a `TRUNCATE`
    /// checkpoint that must leave the WAL empty.
    pub(crate) fn checkpoint_all(&mut self, conn: &Connection) -> Result<(), CaptureError> {
        let (files, watch, busy) = (&*self.files, &mut self.watch, self.busy);
        files.check_names()?;
        files.check_db(watch.db)?;
        watch.observe(&read_head(files)?)?;
        if truncate_checkpoint(conn, busy, files, watch)? {
            Ok(())
        } else {
            Err(CaptureError::Io(std::io::Error::other(
                "the checkpoint left frames in the WAL",
            )))
        }
    }

    /// Runs on the writer thread between two jobs.
    ///
    /// # Errors
    /// [`CaptureError::Foreign`] when the files are not as the writer left them;
    /// [`CaptureError::Io`] for a local failure.
    pub(crate) fn capture(
        &mut self,
        conn: &Connection,
        commit: u64,
        counter_page: u32,
        request: CaptureRequest,
    ) -> Result<Captured, CaptureError> {
        let (files, watch, busy) = (&*self.files, &mut self.watch, self.busy);
        let CaptureRequest { from, checkpoint } = request;
        files.check_names()?;
        files.check_db(watch.db)?;
        let page_size = conn
            .query_row("PRAGMA page_size", [], |r| r.get::<_, u32>(0))
            .map_err(std::io::Error::other)?;
        watch.observe(&read_head(files)?)?;
        let mut reset = false;
        let from = if checkpoint == Checkpoint::Before {
            reset = truncate_checkpoint(conn, busy, files, watch)?;
            0
        } else {
            from
        };
        let len = files.wal_len()?;
        let head = read_head(files)?;
        watch.observe(&head)?;
        let tail = if from < len {
            files.read_wal(from, len)?
        } else {
            Vec::new()
        };
        if let Checkpoint::AfterIfOver(bound) = checkpoint
            && len >= bound
        {
            reset = truncate_checkpoint(conn, busy, files, watch)?;
        }
        Ok(Captured {
            commit,
            page_size,
            counter_page,
            head,
            tail,
            reset,
            db: watch.db,
        })
    }
}

/// Reads `pages` (page numbers up to `db_pages`) from the database file, which must still be
/// as a capture whose checkpoint emptied the WAL left it (`db`).
///
/// # Errors
/// [`CaptureError::Foreign`] when the file changed before or during the read.
pub(crate) fn read_pages(
    files: &OwnedFiles,
    db: DbState,
    page_size: u32,
    db_pages: u32,
    pages: &[u32],
) -> Result<BTreeMap<u32, Vec<u8>>, CaptureError> {
    files.check_db(db)?;
    let ps = u64::from(page_size);
    let mut out = BTreeMap::new();
    for &p in pages.iter().filter(|p| **p >= 1 && **p <= db_pages) {
        let at = (u64::from(p) - 1) * ps;
        out.insert(p, files.read_db(at, at + ps)?);
    }
    files.check_db(db)?;
    Ok(out)
}

/// The database file's size in pages and its pages that differ from a tip, by number.
pub(crate) type FileChanges = (u32, BTreeMap<u32, Vec<u8>>);

/// True when the database file is exactly the state `tip` describes: no page's hash
/// differs ([`file_changes`]) and it has `tip`'s size and page size. What an unpark proves
/// of a parked file before anything is served from it (I8, I13).
///
/// # Errors
/// As [`file_changes`].
pub(crate) fn file_is(
    files: &OwnedFiles,
    tip: &crate::format::checksum::PageHashes,
) -> Result<bool, CaptureError> {
    Ok(file_changes(files, tip)?
        .is_some_and(|(pages, changed)| changed.is_empty() && pages as usize == tip.pages()))
}

/// Pages read per chunk by [`file_changes`]: memory stays bounded whatever the file's size.
const DIFF_CHUNK_PAGES: u64 = 256;

/// Every page of the database file whose hash differs from `tip` (page 1 compared in its
/// canonical form, as images are hashed), with the file's size in pages, read in bounded
/// chunks through the writer's descriptor. `None` when the file's page size is not the
/// tip's. The file must be as the writer's open or last checkpoint left it.
///
/// # Errors
/// [`CaptureError::Foreign`] when the file changed before or during the read, or is not a
/// whole number of pages; [`CaptureError::Io`].
pub(crate) fn file_changes(
    files: &OwnedFiles,
    tip: &crate::format::checksum::PageHashes,
) -> Result<Option<FileChanges>, CaptureError> {
    use crate::format::checksum::page_hash;
    use crate::format::pages::{canonical_page1, image_page_size};
    files.check_unchanged()?;
    let len = files.db_state()?.len();
    let ps = u64::from(tip.page_size());
    if len < ps || image_page_size(&files.read_db(0, 100.min(len))?) != Some(tip.page_size()) {
        return Ok(None);
    }
    if len % ps != 0 {
        return Err(Foreign("the database file is not a whole number of pages".into()).into());
    }
    let pages = len / ps;
    let mut changed = BTreeMap::new();
    let mut first = 0;
    while first < pages {
        let n = DIFF_CHUNK_PAGES.min(pages - first);
        let buf = files.read_db(first * ps, (first + n) * ps)?;
        for (i, page) in buf.chunks(ps as usize).enumerate() {
            let pgno = u32::try_from(first + i as u64 + 1).map_err(std::io::Error::other)?;
            let hash = if pgno == 1 {
                let mut canonical = page.to_vec();
                canonical_page1(&mut canonical);
                page_hash(1, &canonical)
            } else {
                page_hash(pgno, page)
            };
            if tip.get(pgno) != Some(hash) {
                changed.insert(pgno, page.to_vec());
            }
        }
        first += n;
    }
    files.check_unchanged()?;
    let pages = u32::try_from(pages).map_err(std::io::Error::other)?;
    Ok(Some((pages, changed)))
}
