//! Capturing what a ship publishes, on the writer thread, between two transactions.
//!
//! The writer thread is the only connection that writes, and `wal_autocheckpoint` is off, so
//! between two of its jobs the WAL holds exactly the commits up to the commit counter it
//! last raised. A capture copies the WAL bytes after the previous capture (a delta) or the
//! whole WAL (a full snapshot, read together with the database file) and that counter, so
//! the shipper knows exactly which commits it ships (I6).
//!
//! Checkpoints run only here: a full capture checkpoints first (the database file is then
//! stable until the next capture, which the same shipper issues after it has read the file);
//! a delta capture checkpoints after copying, once every committed frame in the WAL is in
//! the copy, when the WAL has outgrown its bound. A copied frame whose delta then fails to
//! publish is kept by the shipper and shipped with the next delta, so a checkpoint never
//! loses a frame that no published entry holds.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;

use crate::wal::{self, Frames};

/// When a capture checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Checkpoint {
    /// Before reading (full snapshots).
    Before,
    /// After reading, if the WAL is at least this many bytes (deltas).
    AfterIfOver(u64),
}

/// What a capture copied.
#[derive(Debug)]
pub(crate) struct Captured {
    /// The commit counter of the last commit in the copy.
    pub commit: u64,
    /// The database's page size in bytes.
    pub page_size: u32,
    /// The WAL file's first 32 bytes (empty when there is no WAL content).
    pub head: Vec<u8>,
    /// The WAL bytes from the requested offset to the end of the file.
    pub tail: Vec<u8>,
    /// True when a checkpoint after the copy emptied the WAL: the next capture starts a new
    /// WAL generation at offset 0.
    pub reset: bool,
}

pub(crate) fn wal_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}

/// `PRAGMA wal_checkpoint(TRUNCATE)` without waiting on readers: the writer thread must not
/// block. Returns true when the WAL is now empty.
fn truncate_checkpoint(conn: &Connection, busy: Duration, wal: &Path) -> bool {
    let ran = conn.busy_timeout(Duration::ZERO).and_then(|()| {
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            r.get::<_, i64>(0)
        })
    });
    if let Err(e) = conn.busy_timeout(busy) {
        tracing::warn!(error = %e, "could not restore busy_timeout after a checkpoint");
    }
    match ran {
        Ok(_) => std::fs::metadata(wal).map(|m| m.len() == 0).unwrap_or(true),
        Err(e) => {
            tracing::debug!(error = %e, "checkpoint skipped");
            false
        }
    }
}

/// Runs on the writer thread between two jobs.
pub(crate) fn capture(
    conn: &Connection,
    db: &Path,
    busy: Duration,
    commit: u64,
    from: u64,
    checkpoint: Checkpoint,
) -> std::io::Result<Captured> {
    let wal = wal_path(db);
    let page_size = conn
        .query_row("PRAGMA page_size", [], |r| r.get::<_, u32>(0))
        .map_err(std::io::Error::other)?;
    let mut reset = false;
    if checkpoint == Checkpoint::Before {
        reset = truncate_checkpoint(conn, busy, &wal);
    }
    let (head, tail, len) = match std::fs::File::open(&wal) {
        Ok(mut f) => {
            let len = f.metadata()?.len();
            let mut head = Vec::with_capacity(wal::HEADER);
            (&mut f).take(wal::HEADER as u64).read_to_end(&mut head)?;
            let mut tail = Vec::new();
            if from < len {
                f.seek(SeekFrom::Start(from))?;
                f.read_to_end(&mut tail)?;
            }
            (head, tail, len)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Vec::new(), Vec::new(), 0),
        Err(e) => return Err(e),
    };
    if let Checkpoint::AfterIfOver(bound) = checkpoint
        && len >= bound
    {
        reset = truncate_checkpoint(conn, busy, &wal);
    }
    Ok(Captured {
        commit,
        page_size,
        head,
        tail,
        reset,
    })
}

/// Builds the full database image (canonical page 1 is the replica's job) from the database
/// file and the committed WAL frames over it. The file is stable: only captures checkpoint.
pub(crate) fn image(db: &Path, page_size: u32, frames: &Frames) -> std::io::Result<Vec<u8>> {
    let mut image = std::fs::read(db)?;
    let ps = page_size as usize;
    let db_pages = match frames.db_pages {
        Some(n) => n as usize,
        None => image.len() / ps,
    };
    image.resize(db_pages * ps, 0);
    for (&pgno, page) in &frames.pages {
        let at = (pgno as usize - 1) * ps;
        image[at..at + ps].copy_from_slice(page);
    }
    Ok(image)
}

/// Reads `pages` (page numbers up to `db_pages`) from the database file, which must be
/// stable: right after a capture whose checkpoint emptied the WAL.
pub(crate) fn read_pages(
    db: &Path,
    page_size: u32,
    db_pages: u32,
    pages: &[u32],
) -> std::io::Result<std::collections::BTreeMap<u32, Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(db)?;
    let ps = page_size as usize;
    let mut out = std::collections::BTreeMap::new();
    for &p in pages.iter().filter(|p| **p >= 1 && **p <= db_pages) {
        let mut buf = vec![0u8; ps];
        f.read_exact_at(&mut buf, (u64::from(p) - 1) * ps as u64)?;
        out.insert(p, buf);
    }
    Ok(out)
}
