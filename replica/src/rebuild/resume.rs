//! Resuming from a local file (I8, I10, I14): a host that released an org keeps its database
//! file with a [`ResumePoint`], and a later claim on the host installs that file instead of
//! downloading, once the file's own bytes prove it holds the newest published position below
//! the claim. Anything else (an older position, one changed byte, a WAL beside it) is not
//! trusted: the caller deletes the file and hydrates.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tracing::info;

use crate::chain::position::{Inherited, Tip};
use crate::fence::log::Window;
use crate::format::checksum::{PageHashes, checksum_hex, page_hash};
use crate::format::entry::EntryBody;
use crate::format::pages::{HEADER_BYTES, canonical_page1, image_page_size};
use crate::replica::blocking;
use crate::{Claim, Error, LogEntry, OrgId, Replica};

/// Where a released claim's database file stands, as its [`crate::Shipper`] left it
/// ([`crate::Shipper::resume_point`]): the log position and database checksum of the chain's
/// tip, and what the chain weighs (for the next shipper's budget). Kept beside the file by
/// the embedder; only a hint: [`Replica::resume`] trusts the file only when the store's entry
/// at the newest position matches the file's own checksum.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResumePoint {
    /// Log position of the snapshot or delta the file holds.
    pub seq: u64,
    /// Database checksum there (16 hex digits), as the shipper computed it.
    pub checksum: String,
    /// Compressed bytes of the chain's snapshot.
    pub snapshot_bytes: u64,
    /// Database pages in the chain's snapshot.
    pub snapshot_pages: u64,
    /// When the chain's snapshot was published, ms since the Unix epoch.
    pub snapshot_at_ms: u64,
    /// Compressed bytes of the deltas a hydrate of the position reads.
    pub delta_bytes: u64,
    /// How many deltas that is.
    pub deltas: u64,
}

impl ResumePoint {
    pub(crate) fn new(seq: u64, checksum: u64, weight: Inherited) -> ResumePoint {
        ResumePoint {
            seq,
            checksum: checksum_hex(checksum),
            snapshot_bytes: weight.snapshot_bytes,
            snapshot_pages: weight.snapshot_pages,
            snapshot_at_ms: weight.snapshot_at_ms,
            delta_bytes: weight.delta_bytes,
            deltas: weight.deltas,
        }
    }
}

/// A local file [`Replica::resume`] accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resumed {
    /// Log position the file holds: the newest published below the claim.
    pub position: u64,
    /// The commit counter the store's entry there records.
    pub commit: u64,
}

impl Replica {
    /// Accepts the database file at `path` (closed, its WAL checkpointed into it) as the
    /// newest state published before `claim`, instead of a [hydrate](Replica::hydrate),
    /// when `point` names that position and the file's page-hash checksum (page 1 in
    /// canonical form) equals the checksum of the store's entry there (for a snapshot
    /// entry: the file's sha256 and size equal the image's). Reads the log's tail from the
    /// head down to the first snapshot or delta entry, and the file once; downloads no blob.
    /// On acceptance the claim holds the position as its chain tip, as after a hydrate.
    ///
    /// `Ok(None)` means "not this file": an older or newer position, a checksum that differs
    /// (a changed byte), a `-wal` or `-journal` beside it, an unreadable header. The caller
    /// then removes the file and hydrates.
    ///
    /// # Errors
    /// [`Error::ClaimUnusable`]; [`Error::Store`] reading the log; [`Error::Io`] reading the
    /// file.
    pub async fn resume(
        &self,
        claim: &mut Claim,
        path: &Path,
        point: &ResumePoint,
    ) -> Result<Option<Resumed>, Error> {
        claim.usable()?;
        let org = claim.org().clone();
        if !claim.is_fresh() {
            return Ok(None);
        }
        let Some(entry) = self
            .newest_position(&org, claim.seq(), claim.below())
            .await?
        else {
            return Ok(None);
        };
        if entry.seq() != point.seq {
            info!(%org, cached = point.seq, newest = entry.seq(), "local file is not the newest position");
            return Ok(None);
        }
        let file = path.to_owned();
        let Some((hashes, sha256, len)) =
            blocking("hashing a local file", move || hash_file(&file)).await?
        else {
            return Ok(None);
        };
        let same = match &entry.body {
            EntryBody::Delta(link) => {
                checksum_hex(hashes.sum()) == link.checksum
                    && hashes.page_size() == link.page_size
                    && hashes.pages() == link.db_pages as usize
            }
            EntryBody::Snapshot(stored) => sha256 == stored.sha256 && len == stored.bytes,
            _ => false,
        };
        if !same {
            info!(%org, seq = entry.seq(), "local file differs from the published position");
            return Ok(None);
        }
        let commit = entry.commit().unwrap_or(0);
        let inherited = Inherited {
            commit,
            snapshot_bytes: point.snapshot_bytes,
            snapshot_pages: point.snapshot_pages,
            snapshot_at_ms: point.snapshot_at_ms,
            delta_bytes: point.delta_bytes,
            deltas: point.deltas,
        };
        let tip = Tip {
            seq: entry.seq(),
            hashes: Arc::new(hashes),
        };
        // Kept, not dropped: the claim's first snapshot looks up the chain's manifest in it.
        claim.keep_below_for_reuse();
        claim.inherit(tip, inherited, None);
        claim.take_prefetched();
        info!(%org, seq = entry.seq(), commit, "resumed from the local file");
        Ok(Some(Resumed {
            position: entry.seq(),
            commit,
        }))
    }

    /// The newest snapshot or delta entry of `org` below `limit`, read from the head down
    /// (one LIST, then one GET per entry down to it; the listing and the entries `seen` holds,
    /// a claim's [`Window`], are not asked for again); `None` when there is none, or an entry
    /// vanished meanwhile (retention: a hydrate sorts that out).
    async fn newest_position(
        &self,
        org: &OrgId,
        limit: u64,
        seen: Option<&Window>,
    ) -> Result<Option<LogEntry>, Error> {
        let seqs = match seen {
            Some(w) => w.seqs.clone(),
            None => self.inner.log.seqs(org).await?,
        };
        for seq in seqs.into_iter().rev().filter(|s| *s < limit) {
            let held = seen.and_then(|w| w.entry(seq)).cloned();
            let entry = match held {
                Some(e) => Some(e),
                None => self.inner.log.read_entry(org, seq).await?,
            };
            match entry {
                Some(e) if e.is_snapshot() || e.is_delta() => return Ok(Some(e)),
                Some(_) => continue,
                None => return Ok(None),
            }
        }
        Ok(None)
    }
}

/// Bytes read per chunk while hashing a file: memory stays bounded whatever its size.
const HASH_CHUNK: usize = 1 << 20;

/// The page hashes, sha256 and size of the database file at `path`, page 1 in canonical
/// form (as images are hashed); `None` when it is not a closed database: a `-wal` or
/// `-journal` beside it, no valid header, not a whole number of pages.
///
/// # Errors
/// [`Error::Io`].
fn hash_file(path: &Path) -> Result<Option<(PageHashes, String, u64)>, Error> {
    for suffix in ["-wal", "-journal"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        match std::fs::metadata(std::path::PathBuf::from(side)) {
            Ok(m) if m.len() > 0 => return Ok(None),
            _ => {}
        }
    }
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut head = [0u8; HEADER_BYTES];
    if len < HEADER_BYTES as u64 {
        return Ok(None);
    }
    f.read_exact(&mut head).map_err(|e| Error::io(path, e))?;
    let Some(page_size) = image_page_size(&head) else {
        return Ok(None);
    };
    let ps = page_size as usize;
    if !len.is_multiple_of(ps as u64) {
        return Ok(None);
    }
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut sha = Sha256::new();
    let mut hashes = Vec::with_capacity((len / ps as u64) as usize);
    let mut buf = vec![0u8; HASH_CHUNK.max(ps) / ps * ps];
    let mut left = len;
    while left > 0 {
        let n = (buf.len() as u64).min(left) as usize;
        let chunk = &mut buf[..n];
        f.read_exact(chunk).map_err(|e| Error::io(path, e))?;
        if hashes.is_empty() {
            canonical_page1(&mut chunk[..ps]);
        }
        sha.update(&*chunk);
        for page in chunk.chunks(ps) {
            let pgno = u32::try_from(hashes.len() + 1)
                .map_err(|e| Error::io(path, std::io::Error::other(e)))?;
            hashes.push(page_hash(pgno, page));
        }
        left -= n as u64;
    }
    let hashes = PageHashes::from_hashes(page_size, hashes);
    Ok(Some((hashes, hex::encode(sha.finalize()), len)))
}
