//! Page hashes and the database checksum that chains deltas (I10).
//!
//! The database checksum follows LiteFS: the XOR over every page of a hash of (page number,
//! big-endian u32 ‖ page bytes) — here CRC-64/NVME through a non-linear finalizer, so pages
//! swapped between positions change it. XOR makes it cheap to update: a changed page swaps
//! its old hash for its new one, so a ship costs O(changed pages), not O(database). Page 1 is
//! hashed in its canonical form (rollback-journal mode, [`crate::format::pages`]), the form
//! every shipped and installed image has. Each delta entry carries the checksum before and
//! after it, as 16 lowercase hex digits ([`checksum_hex`]).

use std::collections::BTreeMap;

use crc_fast::{CrcAlgorithm, Digest};

use crate::Error;
use crate::format::pages::image_page_size;

/// A page's hash: CRC-64/NVME of (page number ‖ page), passed through murmur3's 64-bit
/// finalizer. CRC is affine over GF(2), so an XOR of raw CRCs cannot tell two pages swapped
/// between positions apart; the non-linear finalizer can.
pub(crate) fn page_hash(pgno: u32, page: &[u8]) -> u64 {
    let mut d = Digest::new(CrcAlgorithm::Crc64Nvme);
    d.update(&pgno.to_be_bytes());
    d.update(page);
    let mut h = d.finalize();
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// A checksum as stored in log entries: 16 lowercase hex digits.
pub(crate) fn checksum_hex(sum: u64) -> String {
    format!("{sum:016x}")
}

/// Per-page hashes of a database image and their XOR, the database checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PageHashes {
    page_size: u32,
    /// Hash of page `n` at index `n - 1`; 0 for a page added by [`PageHashes::resize`] and
    /// not yet [set](PageHashes::set) (0 XORs into the sum as nothing).
    hashes: Vec<u64>,
    sum: u64,
}

impl PageHashes {
    /// Hashes every page of a canonical image stored at `object`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the header has no valid page size or the image is not a whole
    /// number of pages.
    pub(crate) fn of_image(object: &str, image: &[u8]) -> Result<PageHashes, Error> {
        let page_size = image_page_size(image)
            .ok_or_else(|| Error::corrupt(object, "image has no page size"))?;
        let ps = page_size as usize;
        if !image.len().is_multiple_of(ps) {
            return Err(Error::corrupt(
                object,
                "image is not a whole number of pages",
            ));
        }
        let hashes: Vec<u64> = image
            .chunks(ps)
            .enumerate()
            .map(|(i, p)| page_hash(i as u32 + 1, p))
            .collect();
        let sum = hashes.iter().fold(0, |a, h| a ^ h);
        Ok(PageHashes {
            page_size,
            hashes,
            sum,
        })
    }

    /// The hashes of pages of `page_size` bytes, page 1 first.
    pub(crate) fn from_hashes(page_size: u32, hashes: Vec<u64>) -> PageHashes {
        let sum = hashes.iter().fold(0, |a, h| a ^ h);
        PageHashes {
            page_size,
            hashes,
            sum,
        }
    }

    /// The table of a sparse rebuild (`levels/sparse.rs`): `pages` pages of `page_size`
    /// bytes whose checksum `sum` is known from elsewhere and whose hashes are not, every
    /// slot 0 until [`PageHashes::learn`] fills it. A page must be learned before it is
    /// [set](PageHashes::set) or [resized](PageHashes::resize) away, or the checksum is
    /// wrong from then on (which the chain's next checksum comparison reports).
    pub(crate) fn sparse(page_size: u32, pages: usize, sum: u64) -> PageHashes {
        PageHashes {
            page_size,
            hashes: vec![0; pages],
            sum,
        }
    }

    /// Records page `pgno`'s hash in a [sparse](PageHashes::sparse) table without changing
    /// the checksum, which already counts it.
    pub(crate) fn learn(&mut self, pgno: u32, hash: u64) {
        if let Some(slot) = (pgno as usize)
            .checked_sub(1)
            .and_then(|i| self.hashes.get_mut(i))
        {
            *slot = hash;
        }
    }

    /// The database checksum.
    pub(crate) fn sum(&self) -> u64 {
        self.sum
    }

    /// Page size in bytes.
    pub(crate) fn page_size(&self) -> u32 {
        self.page_size
    }

    /// Pages in the database these hashes describe.
    pub(crate) fn pages(&self) -> usize {
        self.hashes.len()
    }

    /// The hash of page `pgno` (numbered from 1), if the database has it.
    pub(crate) fn get(&self, pgno: u32) -> Option<u64> {
        (pgno as usize)
            .checked_sub(1)
            .and_then(|i| self.hashes.get(i).copied())
    }

    /// Makes the database `pages` long: pages past the new end leave the checksum, pages
    /// added count as nothing until [set](PageHashes::set).
    pub(crate) fn resize(&mut self, pages: usize) {
        for h in self.hashes.iter().skip(pages) {
            self.sum ^= h;
        }
        self.hashes.resize(pages, 0);
    }

    /// Gives page `pgno` (within the current size) the hash `hash`, updating the checksum.
    pub(crate) fn set(&mut self, pgno: u32, hash: u64) {
        let slot = &mut self.hashes[pgno as usize - 1];
        self.sum ^= *slot ^ hash;
        *slot = hash;
    }

    /// What setting `pages` (page number → new content, each within `db_pages`) on a
    /// database resized to `db_pages` does, computed without changing `self`: pages added
    /// and not in `pages` read as zeros, as SQLite reads them. O(changed pages + pages added
    /// or removed).
    pub(crate) fn change(&self, db_pages: u32, pages: &BTreeMap<u32, Vec<u8>>) -> HashChange {
        let zero = vec![0u8; self.page_size as usize];
        let old = self.hashes.len();
        let new = db_pages as usize;
        let mut sum = self.sum;
        for h in self.hashes.iter().skip(new) {
            sum ^= h;
        }
        let mut changed = Vec::with_capacity(pages.len());
        for p in (old + 1)..=new {
            let p = p as u32;
            if !pages.contains_key(&p) {
                let h = page_hash(p, &zero);
                sum ^= h;
                changed.push((p, h));
            }
        }
        for (&p, page) in pages {
            let h = page_hash(p, page);
            if let Some(old_hash) = self.hashes.get(p as usize - 1) {
                sum ^= old_hash;
            }
            sum ^= h;
            changed.push((p, h));
        }
        HashChange {
            db_pages,
            changed,
            sum,
        }
    }

    /// Applies a change computed by [`PageHashes::change`] on these same hashes.
    pub(crate) fn apply_change(&mut self, change: HashChange) {
        self.hashes.resize(change.db_pages as usize, 0);
        for (p, h) in change.changed {
            self.hashes[p as usize - 1] = h;
        }
        self.sum = change.sum;
    }
}

/// What a delta does to [`PageHashes`]: the new size, the new hashes of the pages it sets,
/// and the checksum after. Computed without changing the hashes, so a ship can compute it
/// before publishing and apply it in place after: O(changed pages), no copy of the table.
#[derive(Debug)]
pub(crate) struct HashChange {
    db_pages: u32,
    changed: Vec<(u32, u64)>,
    /// The database checksum after the change.
    pub(crate) sum: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::pages::{MAGIC, canonical_page1};

    fn image(pages: usize) -> Vec<u8> {
        let mut img = vec![0u8; pages * 512];
        img[..16].copy_from_slice(MAGIC);
        img[16..18].copy_from_slice(&512u16.to_be_bytes());
        canonical_page1(&mut img[..512]);
        img
    }

    #[test]
    fn swapping_two_pages_changes_the_checksum() -> Result<(), Error> {
        let mut a = image(3);
        a[512..1024].fill(1);
        a[1024..].fill(2);
        let mut b = a.clone();
        b[512..1024].fill(2);
        b[1024..].fill(1);
        assert_ne!(
            PageHashes::of_image("a", &a)?.sum(),
            PageHashes::of_image("b", &b)?.sum()
        );
        Ok(())
    }

    #[test]
    fn resize_and_set_equal_a_change_and_a_rehash() -> Result<(), Error> {
        let mut img = image(3);
        let mut hashes = PageHashes::of_image("t", &img)?;
        let pages = BTreeMap::from([(2, vec![9u8; 512]), (4, vec![3u8; 512])]);
        let mut changed = hashes.clone();
        changed.apply_change(hashes.change(4, &pages));
        hashes.resize(4);
        for (&p, page) in &pages {
            hashes.set(p, page_hash(p, page));
        }
        img.resize(4 * 512, 0);
        img[512..1024].fill(9);
        img[1536..].fill(3);
        assert_eq!(hashes, PageHashes::of_image("t", &img)?);
        assert_eq!(changed, hashes);
        Ok(())
    }
}
