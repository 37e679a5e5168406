//! Page deltas: the pages a writer changed since its previous published position (I10).
//!
//! A [`Delta`] is built from the changed pages and the database size after them
//! ([`Delta::new`]), optionally encoded against the pages' content at its base
//! ([`Delta::encode_against`], `encode.rs`), written as a body (`format/body.rs`) that
//! [`crate::Replica::ship_delta`] publishes, and parsed and applied by a hydrate
//! (`DeltaBody`, `rebuild/apply.rs`). The log entry of each delta names its base and carries
//! the database checksum ([`crate::format::checksum`]) before and after it, so a hydrate proves that
//! snapshot + deltas rebuilt exactly the database the writer had.

mod encode;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use crate::Error;
use crate::format::body;
use crate::format::checksum::PageHashes;
use crate::format::pages::{canonical_page1, valid_page_size};

/// Pages changed since the previous published position of a claim, ready to ship with
/// [`crate::Replica::ship_delta`].
#[derive(Clone)]
pub struct Delta {
    page_size: u32,
    db_pages: u32,
    pages: BTreeMap<u32, Vec<u8>>,
    /// Pages encoded against their base content, by page number.
    encoded: BTreeMap<u32, encode::Encoded>,
    /// A compacted delta: applies to the chain's snapshot, not to the previous delta.
    compacted: bool,
    commit: u64,
}

impl std::fmt::Debug for Delta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delta")
            .field("page_size", &self.page_size)
            .field("db_pages", &self.db_pages)
            .field("changed", &self.pages.len())
            .field("commit", &self.commit)
            .finish()
    }
}

impl Delta {
    /// The uncompressed body (`format/body.rs`): each page whole, or as its encoding against
    /// the base when [`Delta::encode_against`] found a shorter one.
    pub(crate) fn body(&self) -> Vec<u8> {
        let records = self
            .pages
            .iter()
            .map(|(pgno, page)| match self.encoded.get(pgno) {
                Some(e) => (*pgno, e.kind, e.bytes.as_slice()),
                None => (*pgno, body::WHOLE, page.as_slice()),
            });
        body::write(self.page_size, self.db_pages, self.pages.len(), records)
    }

    /// A delta of `pages` (page number → page bytes, numbered from 1) leaving the database
    /// `db_pages` pages long, holding the caller's commit counter `commit`. Page 1 is stored
    /// canonicalized (rollback-journal mode), like [`crate::Snapshot`] images. Pages beyond
    /// the old end that are not in `pages` read as zeros, as SQLite reads them.
    ///
    /// # Errors
    /// [`Error::InvalidDelta`] when `page_size` (bytes) is not a power of two in
    /// 512..=65536, a page has another length, or a page number is 0 or above `db_pages`.
    pub fn new(
        page_size: u32,
        db_pages: u32,
        pages: BTreeMap<u32, Vec<u8>>,
        commit: u64,
    ) -> Result<Delta, Error> {
        let bad = |reason: String| Error::InvalidDelta { reason };
        if !valid_page_size(page_size) {
            return Err(bad(format!("page size {page_size}")));
        }
        let mut pages = pages;
        for (&pgno, page) in pages.iter_mut() {
            if pgno == 0 || pgno > db_pages {
                return Err(bad(format!("page {pgno} outside 1..={db_pages}")));
            }
            if page.len() != page_size as usize {
                return Err(bad(format!("page {pgno} has {} bytes", page.len())));
            }
            if pgno == 1 {
                canonical_page1(page);
            }
        }
        Ok(Delta {
            page_size,
            db_pages,
            pages,
            encoded: BTreeMap::new(),
            compacted: false,
            commit,
        })
    }

    /// Makes this a compacted delta: `pages` must hold every page changed since the claim's
    /// snapshot, with its current content, so it applies to the snapshot directly and
    /// supersedes the deltas before it (a hydrate then reads the snapshot, this delta and the
    /// deltas after it). Pages are stored whole. [`crate::Replica::ship_delta`] checks the
    /// claim: the result must equal the chain tip plus these pages.
    pub fn compacted(mut self) -> Delta {
        self.compacted = true;
        self.encoded.clear();
        self
    }

    /// True for a compacted delta.
    pub fn is_compacted(&self) -> bool {
        self.compacted
    }

    /// The pages the delta carries (new content, page 1 canonical), by page number.
    pub fn pages(&self) -> &BTreeMap<u32, Vec<u8>> {
        &self.pages
    }

    /// The caller's commit counter the delta brings the database to.
    pub fn commit(&self) -> u64 {
        self.commit
    }

    /// Database size in pages after the delta.
    pub fn db_pages(&self) -> u32 {
        self.db_pages
    }

    /// Page size in bytes.
    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    /// Number of pages the delta carries.
    pub fn changed_pages(&self) -> usize {
        self.pages.len()
    }

    /// Adds, as explicit zero pages, the pages past the base's end (`base_pages`) that the
    /// delta grows the database by but does not carry (SQLite reads them as zeros). Every
    /// shipped delta then carries each page it adds, which hydrate checks.
    pub(crate) fn fill_growth(&mut self, base_pages: usize) {
        let zero = vec![0u8; self.page_size as usize];
        for p in (base_pages + 1)..=(self.db_pages as usize) {
            self.pages.entry(p as u32).or_insert_with(|| zero.clone());
        }
    }

    /// The first page encoded against content other than `base` describes (a caller's stale
    /// or wrong page cache): publishing it would make a delta no hydrate can rebuild.
    pub(crate) fn wrong_base(&self, base: &PageHashes) -> Option<u32> {
        self.encoded
            .iter()
            .find(|(p, e)| base.get(**p) != Some(e.base_hash))
            .map(|(p, _)| *p)
    }

    /// What applying this delta to a database with `hashes` does to them (see
    /// [`PageHashes::change`]).
    pub(crate) fn hash_change(&self, hashes: &PageHashes) -> crate::format::checksum::HashChange {
        hashes.change(self.db_pages, &self.pages)
    }
}
