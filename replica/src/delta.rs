//! Page deltas and the database checksum that chains them (I10).
//!
//! A [`Delta`] is the set of pages a writer changed since its previous published position,
//! plus the database size after it. Each delta entry in the log names the entry it applies to
//! (`base`) and carries the database checksum before and after it, so a hydrate proves that
//! snapshot + deltas rebuilt exactly the database the writer had.
//!
//! The database checksum follows LiteFS: the XOR over every page of a hash of (page number,
//! big-endian u32 ‖ page bytes) — here CRC-64/NVME through a non-linear finalizer, so pages
//! swapped between positions change it. XOR makes it cheap to update: a
//! changed page swaps its old hash for its new one, so a ship costs O(changed pages), not
//! O(database). Page 1 is hashed in its canonical form (header bytes 18–19 set to 1,
//! rollback-journal mode), the same form every installed image has.

use std::collections::BTreeMap;

use crc_fast::{CrcAlgorithm, Digest};

use crate::Error;
use crate::entry::corrupt;

/// Header bytes of an uncompressed delta body: page size, database pages, changed pages
/// (three little-endian u32).
const BODY_HEADER: usize = 12;
/// Per page: page number (u32 LE) and encoding (u8), then `page_size` bytes.
const PAGE_HEADER: usize = 5;
/// The page bytes are the page itself.
const WHOLE: u8 = 0;
/// The page bytes are the page XOR its content at the delta's base position. Read; written
/// only when [`RUNS`] would not be shorter than a page.
const XOR: u8 = 1;
/// A u32 LE length, then a zstd frame of the page compressed with its content at the delta's
/// base position as a raw-content dictionary (zstd's "patch from" use): unlike a XOR, cells
/// that moved within the page (an insert shifting the cell pointers, a B-tree rebalance)
/// still match, so a changed page costs about its new bytes.
const PATCH: u8 = 2;
/// A u32 LE length, then the page XOR its base content as runs: (u16 LE offset, u16 LE
/// length, that many bytes) for each span that differs, ascending. An in-place change costs
/// its bytes, not a page of mostly zeros to hash and decompress. Used when few bytes
/// changed in place (a counter, a pointer, a rewritten value): cheaper to make than a patch.
const RUNS: u8 = 3;
/// Equal bytes a run absorbs rather than ending: a run header costs 4 bytes.
const RUN_GAP: usize = 4;
/// zstd level of a page patch (each is one small frame; 1 is zstd's fastest positive level).
const PATCH_LEVEL: i32 = 1;
/// Run bytes up to which a page ships as [`RUNS`] without trying a patch: a patch would save
/// at most these few bytes and costs a compression.
const RUNS_ENOUGH: usize = 64;
/// Little-endian first bytes of a zstd formatted dictionary: a base page starting with them
/// would be read as one, so such a page ships whole.
const ZSTD_DICT_MAGIC: [u8; 4] = 0xEC30_A437u32.to_le_bytes();
/// Little-endian first bytes of a standard zstd frame: a patch is exactly one such frame (no
/// legacy-format, skippable or concatenated frames, which the decoder would also take).
const ZSTD_FRAME_MAGIC: [u8; 4] = 0xFD2F_B528u32.to_le_bytes();

/// Pages changed since the previous published position of a claim, ready to ship with
/// [`crate::Replica::ship_delta`].
#[derive(Clone)]
pub struct Delta {
    page_size: u32,
    db_pages: u32,
    pages: BTreeMap<u32, Vec<u8>>,
    /// Pages encoded against their base content, by page number.
    encoded: BTreeMap<u32, Encoded>,
    /// A compacted delta: applies to the chain's snapshot, not to the previous delta.
    compacted: bool,
    commit: u64,
}

/// A page encoded against its content at the delta's base.
#[derive(Clone)]
struct Encoded {
    /// [`RUNS`], [`XOR`] or [`PATCH`].
    kind: u8,
    /// The record's bytes after its kind (and length, for runs and patches).
    bytes: Vec<u8>,
    /// Hash of the base content used, which [`crate::Replica::ship_delta`] checks against
    /// the chain tip before publishing.
    base_hash: u64,
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
    /// A delta of `pages` (page number → page bytes, numbered from 1) leaving the database
    /// `db_pages` pages long, holding the caller's commit counter `commit`. Page 1 is stored
    /// canonicalized (rollback-journal mode), like [`crate::Snapshot`] images. Pages beyond
    /// the old end that are not in `pages` read as zeros, as SQLite reads them.
    ///
    /// # Errors
    /// [`Error::InvalidSnapshot`] when `page_size` is not a power of two in 512..=65536, a
    /// page has another length, or a page number is 0 or above `db_pages`.
    pub fn new(
        page_size: u32,
        db_pages: u32,
        pages: BTreeMap<u32, Vec<u8>>,
        commit: u64,
    ) -> Result<Delta, Error> {
        let bad = |reason: String| Error::InvalidSnapshot {
            org: String::new(),
            reason,
        };
        if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
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

    /// Encodes every page whose content at the base position `base` knows against that
    /// content: as the spans that differ when they take at most 64 bytes, else as a zstd
    /// patch (about the page's new bytes, even when cells moved within the page), else —
    /// when the patch is no smaller than the spans — as the spans again. `base` must
    /// return the page exactly as the base position holds it — the content the previous
    /// published delta or snapshot left — or `None` (the page ships whole); hydrate decodes
    /// against the page it rebuilt, and the database checksum after the delta proves the
    /// result (I10). Page 1 bases are used in canonical form.
    pub fn encode_against<'a>(mut self, base: impl Fn(u32) -> Option<&'a [u8]>) -> Delta {
        if self.compacted {
            return self;
        }
        let ps = self.page_size as usize;
        let mut cctx = zstd::zstd_safe::CCtx::create();
        let mut canonical = Vec::new();
        for (&pgno, page) in &self.pages {
            let Some(mut b) = base(pgno).filter(|b| b.len() == ps) else {
                continue;
            };
            if pgno == 1 {
                canonical.clear();
                canonical.extend_from_slice(b);
                canonical_page1(&mut canonical);
                b = &canonical;
            }
            let base_hash = page_hash(pgno, b);
            let runs = xor_runs(page, b);
            // Spans as long as a page (changes everywhere) ship as a plain XOR.
            let spans = |runs: Vec<u8>| {
                let (kind, bytes) = if runs.len() < ps {
                    (RUNS, runs)
                } else {
                    (XOR, page.iter().zip(b).map(|(n, o)| n ^ o).collect())
                };
                Encoded {
                    kind,
                    bytes,
                    base_hash,
                }
            };
            if runs.len() <= RUNS_ENOUGH || b.starts_with(&ZSTD_DICT_MAGIC) {
                self.encoded.insert(pgno, spans(runs));
                continue;
            }
            let mut frame = Vec::with_capacity(ps);
            let patched = cctx.compress_using_dict(&mut frame, page, b, PATCH_LEVEL);
            let encoding = match patched {
                Ok(n) if n < runs.len() => Encoded {
                    kind: PATCH,
                    bytes: frame,
                    base_hash,
                },
                _ => spans(runs),
            };
            self.encoded.insert(pgno, encoding);
        }
        self
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

    /// Uncompressed body: header, then each page as (u32 LE page number, u8 encoding, bytes)
    /// in ascending page order: [`WHOLE`] and [`XOR`] are followed by `page_size` bytes,
    /// [`RUNS`] and [`PATCH`] by a u32 LE length and that many bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let ps = self.page_size as usize;
        let mut out = Vec::with_capacity(BODY_HEADER + self.pages.len() * (PAGE_HEADER + ps));
        out.extend_from_slice(&self.page_size.to_le_bytes());
        out.extend_from_slice(&self.db_pages.to_le_bytes());
        out.extend_from_slice(&(self.pages.len() as u32).to_le_bytes());
        for (pgno, page) in &self.pages {
            out.extend_from_slice(&pgno.to_le_bytes());
            match self.encoded.get(pgno) {
                Some(e) => {
                    out.push(e.kind);
                    if e.kind != XOR {
                        out.extend_from_slice(&(e.bytes.len() as u32).to_le_bytes());
                    }
                    out.extend_from_slice(&e.bytes);
                }
                None => {
                    out.push(WHOLE);
                    out.extend_from_slice(page);
                }
            }
        }
        out
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
}

/// A published delta body, its shape checked, applied straight into a database image: no
/// per-page copies, so a hydrate's memory is the image plus the bodies in flight.
pub(crate) struct DeltaBody<'a> {
    object: &'a str,
    body: &'a [u8],
    page_size: u32,
    db_pages: u32,
    count: usize,
}

/// The page records of a body, in order; `None` at the first malformed one (which
/// [`DeltaBody::parse`] turns into an error, so later walks never meet it).
struct Records<'a> {
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
    /// Parses a body written by [`Delta::encode`]: header, every record complete and the
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
                .ok_or_else(|| corrupt(object, "delta body truncated"))
        };
        let (page_size, db_pages, count) = (u32_at(0)?, u32_at(4)?, u32_at(8)? as usize);
        if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(corrupt(object, format!("delta page size {page_size}")));
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
                return Err(corrupt(object, format!("delta page {pgno} out of order")));
            }
            if (encoding == PATCH || encoding == RUNS) && bytes.len() >= page_size as usize {
                return Err(corrupt(
                    object,
                    format!("delta page {pgno}: encoding longer than a page"),
                ));
            }
            (last, seen) = (pgno, seen + 1);
        }
        if seen != count || records.at != body.len() {
            return Err(corrupt(
                object,
                "delta body length does not match its header",
            ));
        }
        Ok(parsed)
    }

    fn records(&self) -> Records<'a> {
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

    /// Refuses a delta that grows a `base_pages` database by pages it does not carry whole: shipped
    /// deltas carry every page they add ([`Delta::fill_growth`]), as whole pages (a page past
    /// the base's end has no base content to encode against), and honouring less would
    /// allocate memory the body never paid for (`db_pages` up to 2^32 pages; a patch of a few
    /// bytes can stand for a page of zeros). Pages are unique and within `db_pages`, so it
    /// carries them all exactly when it carries that many above `base_pages`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming the object.
    fn check_growth(&self, base_pages: usize) -> Result<(), Error> {
        let needed = (self.db_pages as usize).saturating_sub(base_pages);
        let carried = self
            .records()
            .filter(|(p, encoding, _)| *p as usize > base_pages && *encoding == WHOLE)
            .count();
        if carried < needed {
            return Err(corrupt(
                self.object,
                format!(
                    "delta grows the database from {base_pages} to {} pages without carrying them",
                    self.db_pages
                ),
            ));
        }
        Ok(())
    }

    /// Applies the pages to `image` (the database at the delta's base, resized to
    /// `db_pages`) and updates `hashes` to match: XOR and patch pages decode against the
    /// base content, page 1 in canonical form. O(changed pages + pages removed). The
    /// growth check ([`DeltaBody::check_growth`]) and the page size come first and change
    /// nothing when they fail; a later error leaves the image part-applied, to be dropped.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the delta grows the database by pages it does not carry
    /// whole, its page size differs from the image's, or a run or patch does not decode
    /// against its base.
    pub(crate) fn apply(&self, image: &mut Vec<u8>, hashes: &mut PageHashes) -> Result<(), Error> {
        self.check_growth(hashes.pages())?;
        if self.page_size != hashes.page_size {
            return Err(corrupt(
                self.object,
                "delta page size differs from the image's",
            ));
        }
        let ps = self.page_size as usize;
        let new = self.db_pages as usize;
        let old = hashes.hashes.len();
        let mut sum = hashes.sum;
        for h in hashes.hashes.iter().skip(new) {
            sum ^= h;
        }
        hashes.hashes.resize(new, 0);
        image.resize(new * ps, 0);
        let mut dctx = zstd::zstd_safe::DCtx::create();
        let mut scratch = Vec::with_capacity(ps);
        for (pgno, encoding, bytes) in self.records() {
            let at = (pgno as usize - 1) * ps;
            let page = &mut image[at..at + ps];
            if pgno == 1 && encoding != WHOLE {
                canonical_page1(page);
            }
            match encoding {
                XOR => page.iter_mut().zip(bytes).for_each(|(o, x)| *o ^= x),
                RUNS => apply_runs(page, bytes).ok_or_else(|| {
                    corrupt(
                        self.object,
                        format!("delta page {pgno}: runs outside the page"),
                    )
                })?,
                PATCH => {
                    scratch.clear();
                    let one_frame = bytes.starts_with(&ZSTD_FRAME_MAGIC)
                        && zstd::zstd_safe::find_frame_compressed_size(bytes).ok()
                            == Some(bytes.len());
                    let decoded = if one_frame {
                        dctx.decompress_using_dict(&mut scratch, bytes, page).ok()
                    } else {
                        None
                    };
                    if decoded != Some(ps) {
                        return Err(corrupt(
                            self.object,
                            format!("delta page {pgno}: patch does not decode against its base"),
                        ));
                    }
                    page.copy_from_slice(&scratch);
                }
                _ => page.copy_from_slice(bytes),
            }
            let h = page_hash(pgno, page);
            if (pgno as usize) <= old {
                sum ^= hashes.hashes[pgno as usize - 1];
            }
            sum ^= h;
            hashes.hashes[pgno as usize - 1] = h;
        }
        hashes.sum = sum;
        Ok(())
    }
}

/// The spans where `page` differs from `base`, as [`RUNS`] bytes: (u16 LE offset, u16 LE
/// length, page XOR base over the span). Up to [`RUN_GAP`] equal bytes stay inside a run;
/// runs are split to fit u16 lengths.
fn xor_runs(page: &[u8], base: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < page.len() {
        if page[i] == base[i] {
            i += 1;
            continue;
        }
        let start = i;
        let (mut end, mut same) = (i + 1, 0);
        i += 1;
        while i < page.len() && i - start < usize::from(u16::MAX) && same < RUN_GAP {
            if page[i] == base[i] {
                same += 1;
            } else {
                (end, same) = (i + 1, 0);
            }
            i += 1;
        }
        i = end;
        // Pages are at most 65536 bytes, so a run starts below 65536 and its length fits.
        out.extend_from_slice(&(start as u16).to_le_bytes());
        out.extend_from_slice(&((end - start) as u16).to_le_bytes());
        out.extend(
            page[start..end]
                .iter()
                .zip(&base[start..end])
                .map(|(n, o)| n ^ o),
        );
    }
    out
}

/// XORs [`RUNS`] bytes into `page`; `None` when a run is cut short or leaves the page.
fn apply_runs(page: &mut [u8], mut runs: &[u8]) -> Option<()> {
    while !runs.is_empty() {
        let head = runs.get(..4)?;
        let at = usize::from(u16::from_le_bytes([head[0], head[1]]));
        let len = usize::from(u16::from_le_bytes([head[2], head[3]]));
        let bytes = runs.get(4..4 + len)?;
        page.get_mut(at..at + len)?
            .iter_mut()
            .zip(bytes)
            .for_each(|(o, x)| *o ^= x);
        runs = &runs[4 + len..];
    }
    Some(())
}

/// Sets page 1's read/write format bytes to rollback-journal mode.
pub(crate) fn canonical_page1(page: &mut [u8]) {
    if page.len() >= 100 && page[..16] == *b"SQLite format 3\0" {
        page[18] = 1;
        page[19] = 1;
    }
}

/// Page size recorded in an SQLite header (bytes 16–17; 1 means 65536).
pub(crate) fn image_page_size(image: &[u8]) -> Option<u32> {
    let raw = u16::from_be_bytes([*image.get(16)?, *image.get(17)?]) as u32;
    let ps = if raw == 1 { 65536 } else { raw };
    ((512..=65536).contains(&ps) && ps.is_power_of_two()).then_some(ps)
}

/// A page's hash: CRC-64/NVME of (page number ‖ page), passed through murmur3's 64-bit
/// finalizer. CRC is affine over GF(2), so an XOR of raw CRCs cannot tell two pages swapped
/// between positions apart; the non-linear finalizer can.
fn page_hash(pgno: u32, page: &[u8]) -> u64 {
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

/// Per-page hashes of a database image and their XOR, the database checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PageHashes {
    page_size: u32,
    hashes: Vec<u64>,
    sum: u64,
}

impl PageHashes {
    /// Hashes every page of a canonical image.
    pub(crate) fn of_image(object: &str, image: &[u8]) -> Result<PageHashes, Error> {
        let page_size =
            image_page_size(image).ok_or_else(|| corrupt(object, "image has no page size"))?;
        let ps = page_size as usize;
        if !image.len().is_multiple_of(ps) {
            return Err(corrupt(object, "image is not a whole number of pages"));
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

    /// The database checksum.
    pub(crate) fn sum(&self) -> u64 {
        self.sum
    }

    pub(crate) fn page_size(&self) -> u32 {
        self.page_size
    }

    /// The hashes after `delta`, computed without changing `self`: the new page hashes,
    /// and the checksum. O(changed pages + pages added or removed).
    pub(crate) fn change(&self, delta: &Delta) -> HashChange {
        let zero = vec![0u8; self.page_size as usize];
        let old = self.hashes.len();
        let new = delta.db_pages as usize;
        let mut sum = self.sum;
        for h in self.hashes.iter().skip(new) {
            sum ^= h;
        }
        let mut changed = Vec::with_capacity(delta.pages.len());
        for p in (old + 1)..=new {
            let p = p as u32;
            if !delta.pages.contains_key(&p) {
                let h = page_hash(p, &zero);
                sum ^= h;
                changed.push((p, h));
            }
        }
        for (&p, page) in &delta.pages {
            let h = page_hash(p, page);
            if let Some(old_hash) = self.hashes.get(p as usize - 1) {
                sum ^= old_hash;
            }
            sum ^= h;
            changed.push((p, h));
        }
        HashChange {
            db_pages: delta.db_pages,
            changed,
            sum,
        }
    }

    /// The first page `delta` encoded against content other than these hashes describe
    /// (a caller's stale or wrong base): publishing it would make a delta no hydrate can
    /// rebuild.
    pub(crate) fn wrong_base(&self, delta: &Delta) -> Option<u32> {
        delta
            .encoded
            .iter()
            .find(|(p, e)| self.hashes.get(**p as usize - 1) != Some(&e.base_hash))
            .map(|(p, _)| *p)
    }

    /// Pages in the database these hashes describe.
    pub(crate) fn pages(&self) -> usize {
        self.hashes.len()
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
    pub(crate) sum: u64,
}

/// A checksum as stored in log entries: 16 lowercase hex digits.
pub(crate) fn checksum_hex(sum: u64) -> String {
    format!("{sum:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(pages: u32, fill: u8) -> Vec<u8> {
        let mut img = vec![fill; pages as usize * 512];
        img[..16].copy_from_slice(b"SQLite format 3\0");
        img[16..18].copy_from_slice(&512u16.to_be_bytes());
        canonical_page1(&mut img[..512]);
        img
    }

    /// Applies `d` as hydrate does (encoded, parsed, growth-checked) and as a ship does
    /// (`change` then `apply_change`); both must equal hashing the result from scratch.
    fn apply_both_ways(d: &Delta, img: &mut Vec<u8>, hashes: &mut PageHashes) -> Result<(), Error> {
        let mut shipped = hashes.clone();
        shipped.apply_change(shipped.change(d));
        let body = d.encode();
        DeltaBody::parse("t", &body)?.apply(img, hashes)?;
        assert_eq!(*hashes, PageHashes::of_image("t", img)?);
        assert_eq!(shipped, *hashes);
        Ok(())
    }

    #[test]
    fn incremental_checksum_equals_recomputed_after_grow_change_and_shrink() -> Result<(), Error> {
        let mut img = image(4, 7);
        let mut hashes = PageHashes::of_image("t", &img)?;
        let mut pages = BTreeMap::new();
        pages.insert(2, vec![9u8; 512]);
        pages.insert(6, vec![3u8; 512]);
        // Grows to 6 pages; page 5 is carried as the zeros SQLite reads there.
        let mut d = Delta::new(512, 6, pages, 1)?;
        d.fill_growth(4);
        apply_both_ways(&d, &mut img, &mut hashes)?;
        assert_eq!(img.len(), 6 * 512);
        let shrink = Delta::new(512, 3, BTreeMap::new(), 2)?;
        apply_both_ways(&shrink, &mut img, &mut hashes)?;
        assert_eq!(img.len(), 3 * 512);
        Ok(())
    }

    #[test]
    fn a_delta_that_grows_without_carrying_the_pages_is_refused() -> Result<(), Error> {
        let img = image(2, 7);
        let hashes = PageHashes::of_image("t", &img)?;
        let body = Delta::new(512, 4, BTreeMap::from([(4, vec![1u8; 512])]), 1)?.encode();
        let (mut img2, mut hashes2) = (img.clone(), hashes.clone());
        let applied = DeltaBody::parse("t", &body)?.apply(&mut img2, &mut hashes2);
        assert!(matches!(applied, Err(Error::Corrupt { .. })), "{applied:?}");
        // Refused before anything changed.
        assert_eq!((img2, hashes2), (img, hashes));
        Ok(())
    }

    #[test]
    fn swapping_two_pages_changes_the_checksum() -> Result<(), Error> {
        let mut a = image(3, 0);
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

    /// Deterministic pseudo-random bytes (xorshift), so pages do not compress on their own.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// A canonical 3-page image of noise.
    fn noisy_image(seed: u64) -> Vec<u8> {
        let mut img = noise(seed, 3 * 512);
        img[..16].copy_from_slice(b"SQLite format 3\0");
        img[16..18].copy_from_slice(&512u16.to_be_bytes());
        canonical_page1(&mut img[..512]);
        img
    }

    /// Parses `body` and applies it to `img`, as hydrate does.
    fn apply_body(body: &[u8], img: &[u8]) -> Result<Vec<u8>, Error> {
        let (mut img, mut hashes) = (img.to_vec(), PageHashes::of_image("x", img)?);
        DeltaBody::parse("x", body)?.apply(&mut img, &mut hashes)?;
        assert_eq!(hashes, PageHashes::of_image("x", &img)?);
        Ok(img)
    }

    #[test]
    fn patch_pages_decode_against_the_base_image_even_when_content_moved() -> Result<(), Error> {
        let base = noisy_image(7);
        // Page 3: 40 new bytes inserted in the middle, shifting the rest (a B-tree insert).
        let mut new3 = base[1024..1224].to_vec();
        new3.extend_from_slice(&noise(99, 40));
        new3.extend_from_slice(&base[1224..1536 - 40]);
        let mut new1 = base[..512].to_vec();
        new1[200] = 9;
        let pages = BTreeMap::from([(1, new1.clone()), (3, new3.clone())]);
        let d = Delta::new(512, 3, pages, 2)?.encode_against(|p| {
            let at = (p as usize - 1) * 512;
            base.get(at..at + 512)
        });
        // One byte changed in place: runs. Content shifted: a patch, about the 40 new bytes
        // (a XOR of the shifted page would be noise).
        assert_eq!(d.encoded.get(&1).map(|e| e.kind), Some(RUNS));
        assert_eq!(PageHashes::of_image("x", &base)?.wrong_base(&d), None);
        assert_eq!(
            PageHashes::of_image("x", &noisy_image(8))?.wrong_base(&d),
            Some(1)
        );
        assert_eq!(d.encoded.get(&3).map(|e| e.kind), Some(PATCH));
        let body = d.encode();
        let stored = zstd::bulk::compress(&body, 3).map_err(|e| corrupt("x", e))?;
        assert!(stored.len() < 200, "{} bytes stored", stored.len());
        let back = apply_body(&body, &base)?;
        assert_eq!(&back[1024..], &new3[..]);
        assert_eq!(&back[..512], &new1[..]);
        // Against another base the result differs (or does not decode); the checksum after
        // the delta catches the first case.
        match apply_body(&body, &noisy_image(8)) {
            Ok(other) => assert_ne!(&other[1024..], &new3[..]),
            Err(e) => assert!(matches!(e, Error::Corrupt { .. }), "{e}"),
        }
        Ok(())
    }

    #[test]
    fn runs_round_trip_sparse_dense_and_page_long_changes() -> Result<(), Error> {
        // 64 KiB pages: a change longer than a u16 run, sparse bytes, a rewritten value.
        let ps = 65536usize;
        let mut base = noise(11, 2 * ps);
        base[..16].copy_from_slice(b"SQLite format 3\0");
        base[16..18].copy_from_slice(&1u16.to_be_bytes());
        canonical_page1(&mut base[..ps]);
        let mut new2 = base[ps..].to_vec();
        for (i, b) in new2.iter_mut().enumerate() {
            if i % 9 == 0 || (1000..1512).contains(&i) {
                *b ^= 0x33;
            }
        }
        let mut new1 = base[..ps].to_vec();
        new1[100..100 + 65000].iter_mut().for_each(|b| *b = !*b);
        let pages = BTreeMap::from([(1, new1.clone()), (2, new2.clone())]);
        let d = Delta::new(65536, 2, pages, 2)?.encode_against(|p| {
            let at = (p as usize - 1) * ps;
            base.get(at..at + ps)
        });
        let back = apply_body(&d.encode(), &base)?;
        assert_eq!(&back[..ps], &new1[..]);
        assert_eq!(&back[ps..], &new2[..]);
        // A one-byte change costs a run, not a page.
        let mut small = base[ps..].to_vec();
        small[5] ^= 1;
        let d =
            Delta::new(65536, 2, BTreeMap::from([(2, small.clone())]), 3)?.encode_against(|p| {
                let at = (p as usize - 1) * ps;
                base.get(at..at + ps)
            });
        assert_eq!(
            d.encoded.get(&2).map(|e| (e.kind, e.bytes.len())),
            Some((RUNS, 5))
        );
        assert_eq!(&apply_body(&d.encode(), &base)?[ps..], &small[..]);
        Ok(())
    }

    #[test]
    fn crafted_runs_are_corrupt_not_panics() -> Result<(), Error> {
        let base = noisy_image(4);
        let record = |runs: &[u8]| {
            let mut body = Vec::new();
            for v in [512u32, 3, 1, 2] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            body.push(RUNS);
            body.extend_from_slice(&(runs.len() as u32).to_le_bytes());
            body.extend_from_slice(runs);
            body
        };
        // Past the page's end, a length past the record, a header cut short, a run as long
        // as the page (the record would not be shorter than a page).
        let past = [0xff, 0x01, 2, 0, 1, 1];
        let long = [0, 0, 200, 0, 1, 2, 3];
        let mut full = vec![0, 0, 0, 2];
        full.extend_from_slice(&[1; 512]);
        for runs in [&past[..], &long[..], &[1, 2, 3][..], &full[..]] {
            match apply_body(&record(runs), &base) {
                Err(Error::Corrupt { .. }) => {}
                other => panic!("expected Corrupt, got {other:?}"),
            }
        }
        Ok(())
    }

    #[test]
    fn xor_bodies_from_earlier_versions_still_decode() -> Result<(), Error> {
        let base = noisy_image(3);
        let mut new2 = base[512..1024].to_vec();
        new2[10] ^= 0xff;
        let mut body = Vec::new();
        for v in [512u32, 3, 1, 2] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.push(XOR);
        body.extend(new2.iter().zip(&base[512..1024]).map(|(n, o)| n ^ o));
        let back = apply_body(&body, &base)?;
        assert_eq!(&back[512..1024], &new2[..]);
        Ok(())
    }

    #[test]
    fn crafted_patches_are_corrupt_not_panics() -> Result<(), Error> {
        let base = noisy_image(5);
        let record = |len: u32, frame: &[u8]| {
            let mut body = Vec::new();
            for v in [512u32, 3, 1, 2] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            body.push(PATCH);
            body.extend_from_slice(&len.to_le_bytes());
            body.extend_from_slice(frame);
            body
        };
        // A length past the body, u32::MAX, a patch as long as a page, garbage, an empty
        // frame, and a frame of a page too big: each a typed error.
        let big = zstd::bulk::compress(&noise(1, 1024), 3).map_err(|e| corrupt("x", e))?;
        let short = zstd::bulk::compress(&noise(1, 100), 3).map_err(|e| corrupt("x", e))?;
        for body in [
            record(100, &[1, 2, 3]),
            record(u32::MAX, &[1, 2, 3]),
            record(512, &[0; 512]),
            record(3, &[1, 2, 3]),
            record(0, &[]),
            record(big.len() as u32, &big),
            record(short.len() as u32, &short),
        ] {
            match apply_body(&body, &base) {
                Err(Error::Corrupt { .. }) => {}
                other => panic!("expected Corrupt, got {other:?}"),
            }
        }
        // Input the zstd decoder takes but the encoder never writes, here decoding to exactly
        // the right page: two concatenated frames, a skippable frame before a real one.
        let mut want = noise(9, 64);
        want.resize(512, 0);
        let half = |r: std::ops::Range<usize>| zstd::bulk::compress(&want[r], 3);
        let mut two = half(0..256).map_err(|e| corrupt("x", e))?;
        two.extend(half(256..512).map_err(|e| corrupt("x", e))?);
        let mut skippable = 0x184D_2A50u32.to_le_bytes().to_vec();
        skippable.extend_from_slice(&4u32.to_le_bytes());
        skippable.extend_from_slice(&[0; 4]);
        skippable.extend(zstd::bulk::compress(&want, 3).map_err(|e| corrupt("x", e))?);
        for frames in [two, skippable] {
            match apply_body(&record(frames.len() as u32, &frames), &base) {
                Err(Error::Corrupt { .. }) => {}
                other => panic!("expected Corrupt, got {other:?}"),
            }
        }
        Ok(())
    }

    #[test]
    fn a_grown_page_must_be_carried_whole() -> Result<(), Error> {
        // A 9-byte patch against the zeros past the end would stand for a whole page: the
        // body must pay for the pages it adds.
        let base = noisy_image(6);
        let zeros = zstd::bulk::compress(&[0u8; 512], 1).map_err(|e| corrupt("x", e))?;
        let mut body = Vec::new();
        for v in [512u32, 4, 1, 4] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.push(PATCH);
        body.extend_from_slice(&(zeros.len() as u32).to_le_bytes());
        body.extend_from_slice(&zeros);
        assert!(matches!(
            apply_body(&body, &base),
            Err(Error::Corrupt { .. })
        ));
        Ok(())
    }

    #[test]
    fn body_round_trips_and_rejects_bad_shapes() -> Result<(), Error> {
        let mut pages = BTreeMap::new();
        pages.insert(1, image(1, 5));
        pages.insert(3, vec![4u8; 512]);
        let d = Delta::new(512, 3, pages, 9)?;
        let body = d.encode();
        let parsed = DeltaBody::parse("x", &body)?;
        assert_eq!(
            (
                parsed.page_size(),
                parsed.db_pages(),
                parsed.changed_pages()
            ),
            (512, 3, 2)
        );
        assert!(DeltaBody::parse("x", &body[..body.len() - 1]).is_err());
        let mut swapped = body.clone();
        swapped[12..16].copy_from_slice(&5u32.to_le_bytes());
        assert!(matches!(
            DeltaBody::parse("x", &swapped),
            Err(Error::Corrupt { .. })
        ));
        let mut encoding = body.clone();
        encoding[16] = 7;
        assert!(matches!(
            DeltaBody::parse("x", &encoding),
            Err(Error::Corrupt { .. })
        ));
        assert!(Delta::new(512, 2, BTreeMap::from([(3, vec![0; 512])]), 1).is_err());
        assert!(Delta::new(500, 2, BTreeMap::new(), 1).is_err());
        Ok(())
    }
}
