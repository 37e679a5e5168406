//! Reading committed frames out of the org database's WAL file
//! (format: <https://sqlite.org/fileformat2.html#the_write_ahead_log>).
//!
//! A frame is accepted only if its salts match the WAL header and its cumulative checksum
//! continues the chain; pages are taken only up to the last commit frame. Frames after it
//! belong to no committed transaction (a rolled-back spill, or a stale generation), so a
//! delta always ends at a commit (I6).

use std::collections::BTreeMap;

pub(crate) const HEADER: usize = 32;
const FRAME_HEADER: usize = 24;
const MAGIC_LE: u32 = 0x377f_0682;
const MAGIC_BE: u32 = 0x377f_0683;

/// Where the next capture continues: just after the last consumed commit frame of one WAL
/// generation (identified by its salts), with the running checksum there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WalPos {
    pub offset: u64,
    salt: [u8; 8],
    ckpt: u32,
    cksum: [u32; 2],
    big_endian: bool,
    pub page_size: u32,
}

/// The committed frames read from one capture.
#[derive(Debug, Default)]
pub(crate) struct Frames {
    /// Newest committed version of every page written, page number → bytes.
    pub pages: BTreeMap<u32, Vec<u8>>,
    /// Database size in pages after the last commit, if any commit was read.
    pub db_pages: Option<u32>,
    /// Position after the last commit frame; `None` when the WAL has no header yet.
    pub end: Option<WalPos>,
}

/// Why frames could not be read from where the chain expected them; the caller falls back to
/// a full snapshot.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct WalError(pub String);

fn word(b: &[u8], big_endian: bool) -> u32 {
    let a = [b[0], b[1], b[2], b[3]];
    if big_endian {
        u32::from_be_bytes(a)
    } else {
        u32::from_le_bytes(a)
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// SQLite's WAL checksum: Fibonacci-weighted sums of 32-bit words, continued from `s`.
fn checksum(data: &[u8], mut s: [u32; 2], big_endian: bool) -> [u32; 2] {
    for c in data.chunks_exact(8) {
        s[0] = s[0]
            .wrapping_add(word(&c[..4], big_endian))
            .wrapping_add(s[1]);
        s[1] = s[1]
            .wrapping_add(word(&c[4..], big_endian))
            .wrapping_add(s[0]);
    }
    s
}

/// Parses a WAL header, checking magic, version and its own checksum.
fn header(h: &[u8]) -> Result<WalPos, WalError> {
    if h.len() < HEADER {
        return Err(WalError("WAL header missing".into()));
    }
    let magic = be32(&h[0..4]);
    let big_endian = match magic {
        MAGIC_LE => false,
        MAGIC_BE => true,
        m => return Err(WalError(format!("WAL magic {m:#x}"))),
    };
    if be32(&h[4..8]) != 3_007_000 {
        return Err(WalError("WAL format version".into()));
    }
    let page_size = be32(&h[8..12]);
    if !crate::format::pages::valid_page_size(page_size) {
        return Err(WalError(format!("WAL page size {page_size}")));
    }
    let cksum = checksum(&h[..24], [0, 0], big_endian);
    if cksum != [be32(&h[24..28]), be32(&h[28..32])] {
        return Err(WalError("WAL header checksum".into()));
    }
    let mut salt = [0u8; 8];
    salt.copy_from_slice(&h[16..24]);
    Ok(WalPos {
        offset: HEADER as u64,
        salt,
        ckpt: be32(&h[12..16]),
        cksum,
        big_endian,
        page_size,
    })
}

/// A WAL generation: the checkpoint sequence number and first salt of its header. SQLite
/// adds one to both each time a checkpoint restarts the WAL, and draws the second salt anew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Generation {
    ckpt: u32,
    salt: [u8; 8],
}

impl Generation {
    /// The generation of a WAL header (its first 32 bytes).
    ///
    /// # Errors
    /// [`WalError`] when the header is damaged.
    pub(crate) fn of(head: &[u8]) -> Result<Generation, WalError> {
        let h = header(head)?;
        Ok(Generation {
            ckpt: h.ckpt,
            salt: h.salt,
        })
    }

    /// True when `later` can follow `self` through restarts of the WAL by checkpoints: its
    /// checkpoint sequence and first salt advanced by the same non-zero count.
    pub(crate) fn restarted_into(&self, later: &Generation) -> bool {
        let steps = later.ckpt.wrapping_sub(self.ckpt);
        steps != 0 && be32(&later.salt[..4]).wrapping_sub(be32(&self.salt[..4])) == steps
    }
}

/// Reads the committed frames after `from`.
///
/// `head` is the WAL file's first 32 bytes now; `tail` its bytes from `from.offset` (from 0,
/// header included, when `from` is `None`: a fresh WAL generation or a full read).
///
/// # Errors
/// [`WalError`] when the WAL was restarted or rewritten since `from` (other salts), or its
/// header is damaged: the frames between are no longer readable and the caller must ship a
/// full snapshot.
pub(crate) fn read(head: &[u8], tail: &[u8], from: Option<WalPos>) -> Result<Frames, WalError> {
    if head.is_empty() {
        return match from {
            None => Ok(Frames::default()),
            Some(_) => Err(WalError("WAL file is gone".into())),
        };
    }
    let now = header(head)?;
    // `base` is the file offset of `tail[0]`; `at` indexes into `tail`.
    let (mut pos, base, mut at) = match from {
        None => (now, 0u64, HEADER),
        Some(p) if p.salt == now.salt && p.ckpt == now.ckpt && p.page_size == now.page_size => {
            (p, p.offset, 0)
        }
        Some(_) => return Err(WalError("WAL was restarted since the last capture".into())),
    };
    let ps = pos.page_size as usize;
    let mut out = Frames {
        end: Some(pos),
        ..Frames::default()
    };
    let mut uncommitted: Vec<(u32, &[u8])> = Vec::new();
    let mut running = pos.cksum;
    while at + FRAME_HEADER + ps <= tail.len() {
        let fh = &tail[at..at + FRAME_HEADER];
        let page = &tail[at + FRAME_HEADER..at + FRAME_HEADER + ps];
        if fh[8..16] != pos.salt {
            break;
        }
        let c = checksum(
            page,
            checksum(&fh[..8], running, pos.big_endian),
            pos.big_endian,
        );
        if c != [be32(&fh[16..20]), be32(&fh[20..24])] {
            break;
        }
        running = c;
        at += FRAME_HEADER + ps;
        uncommitted.push((be32(&fh[0..4]), page));
        let db_pages = be32(&fh[4..8]);
        if db_pages != 0 {
            for (pgno, page) in uncommitted.drain(..) {
                out.pages.insert(pgno, page.to_vec());
            }
            // A commit that shrinks the database drops the pages beyond its end.
            out.pages.retain(|p, _| *p <= db_pages);
            out.db_pages = Some(db_pages);
            pos.offset = base + at as u64;
            pos.cksum = running;
            out.end = Some(pos);
        }
    }
    Ok(out)
}
