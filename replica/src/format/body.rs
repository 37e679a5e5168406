//! The delta body format: what a delta blob holds once decompressed.
//!
//! ```text
//! page_size u32 LE | db_pages u32 LE | count u32 LE
//! count records, page numbers strictly ascending, each:
//!   pgno u32 LE | encoding u8 | WHOLE, XOR: page_size bytes
//!                             | RUNS, PATCH: len u32 LE, len bytes (shorter than a page)
//! ```
//!
//! Encodings: [`WHOLE`] the page; [`XOR`] the page XOR its base; [`PATCH`] one zstd frame of
//! the page with its base as a raw-content dictionary; [`RUNS`] the page XOR its base as
//! (u16 LE offset, u16 LE length, bytes) spans. Pages past the base's end are carried whole.

use crate::Error;
use crate::format::pages::valid_page_size;

/// Header bytes of an uncompressed delta body: page size, database pages, changed pages
/// (three little-endian u32).
const BODY_HEADER: usize = 12;
/// Per page: page number (u32 LE) and encoding (u8), then `page_size` bytes.
const PAGE_HEADER: usize = 5;
/// The page bytes are the page itself.
pub(crate) const WHOLE: u8 = 0;
/// The page bytes are the page XOR its content at the delta's base position. Read; written
/// only when [`RUNS`] would not be shorter than a page.
pub(crate) const XOR: u8 = 1;
/// A u32 LE length, then a zstd frame of the page compressed with its content at the delta's
/// base position as a raw-content dictionary (zstd's "patch from" use): unlike a XOR, cells
/// that moved within the page (an insert shifting the cell pointers, a B-tree rebalance)
/// still match, so a changed page costs about its new bytes.
pub(crate) const PATCH: u8 = 2;
/// A u32 LE length, then the page XOR its base content as runs: (u16 LE offset, u16 LE
/// length, that many bytes) for each span that differs, ascending. An in-place change costs
/// its bytes, not a page of mostly zeros to hash and decompress. Used when few bytes
/// changed in place (a counter, a pointer, a rewritten value): cheaper to make than a patch.
pub(crate) const RUNS: u8 = 3;

/// Writes a body: the header, then each record `(page number, encoding, bytes)` in the
/// order given (ascending page numbers): [`WHOLE`] and [`XOR`] records are followed by their
/// `page_size` bytes, [`RUNS`] and [`PATCH`] by a u32 LE length and that many bytes. `count`
/// is the number of records.
pub(crate) fn write<'a>(
    page_size: u32,
    db_pages: u32,
    count: usize,
    records: impl Iterator<Item = (u32, u8, &'a [u8])>,
) -> Vec<u8> {
    let ps = page_size as usize;
    let mut out = Vec::with_capacity(BODY_HEADER + count * (PAGE_HEADER + ps));
    out.extend_from_slice(&page_size.to_le_bytes());
    out.extend_from_slice(&db_pages.to_le_bytes());
    out.extend_from_slice(&(count as u32).to_le_bytes());
    for (pgno, kind, bytes) in records {
        out.extend_from_slice(&pgno.to_le_bytes());
        out.push(kind);
        if kind != XOR && kind != WHOLE {
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        }
        out.extend_from_slice(bytes);
    }
    out
}

/// A published delta body, its shape checked, applied straight into a database image: no
/// per-page copies, so a hydrate's memory is the image plus the bodies in flight.
pub(crate) struct DeltaBody<'a> {
    pub(crate) object: &'a str,
    body: &'a [u8],
    pub(crate) page_size: u32,
    pub(crate) db_pages: u32,
    count: usize,
}

/// The page records of a body, in order; `None` at the first malformed one (which
/// [`DeltaBody::parse`] turns into an error, so later walks never meet it).
pub(crate) struct Records<'a> {
    body: &'a [u8],
    at: usize,
    left: usize,
    ps: usize,
}

impl<'a> Iterator for Records<'a> {
    /// (page number, encoding, bytes).
    type Item = (u32, u8, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let head = self.body.get(self.at..self.at.checked_add(PAGE_HEADER)?)?;
        let pgno = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let encoding = head[4];
        let mut at = self.at + PAGE_HEADER;
        let len = match encoding {
            WHOLE | XOR => self.ps,
            RUNS | PATCH => {
                let len = self.body.get(at..at + 4)?;
                at += 4;
                u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize
            }
            _ => return None,
        };
        let bytes = self.body.get(at..at.checked_add(len)?)?;
        self.at = at + len;
        self.left -= 1;
        Some((pgno, encoding, bytes))
    }
}

impl<'a> DeltaBody<'a> {
    /// Parses a body written by [`Delta::body`]: header, every record complete and the
    /// last one ending the body, page numbers strictly ascending and within `db_pages`,
    /// known encodings, runs and patches shorter than a page.
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming `object` for any other shape.
    pub(crate) fn parse(object: &'a str, body: &'a [u8]) -> Result<DeltaBody<'a>, Error> {
        let u32_at = |i: usize| -> Result<u32, Error> {
            body.get(i..i + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or_else(|| Error::corrupt(object, "delta body truncated"))
        };
        let (page_size, db_pages, count) = (u32_at(0)?, u32_at(4)?, u32_at(8)? as usize);
        if !valid_page_size(page_size) {
            return Err(Error::corrupt(
                object,
                format!("delta page size {page_size}"),
            ));
        }
        let parsed = DeltaBody {
            object,
            body,
            page_size,
            db_pages,
            count,
        };
        let (mut last, mut seen, mut records) = (0u32, 0usize, parsed.records());
        for (pgno, encoding, bytes) in records.by_ref() {
            if pgno <= last || pgno > db_pages {
                return Err(Error::corrupt(
                    object,
                    format!("delta page {pgno} out of order"),
                ));
            }
            if (encoding == PATCH || encoding == RUNS) && bytes.len() >= page_size as usize {
                return Err(Error::corrupt(
                    object,
                    format!("delta page {pgno}: encoding longer than a page"),
                ));
            }
            (last, seen) = (pgno, seen + 1);
        }
        if seen != count || records.at != body.len() {
            return Err(Error::corrupt(
                object,
                "delta body length does not match its header",
            ));
        }
        Ok(parsed)
    }

    /// The page records: (page number, encoding, bytes), ascending.
    pub(crate) fn records(&self) -> Records<'a> {
        Records {
            body: self.body,
            at: BODY_HEADER,
            left: self.count,
            ps: self.page_size as usize,
        }
    }

    /// Page size in bytes.
    pub(crate) fn page_size(&self) -> u32 {
        self.page_size
    }

    /// Database size in pages after the delta.
    pub(crate) fn db_pages(&self) -> u32 {
        self.db_pages
    }

    /// Number of pages the body carries.
    pub(crate) fn changed_pages(&self) -> usize {
        self.count
    }
}
