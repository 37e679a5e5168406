//! Applying a parsed delta body to a database image, page by page, updating the page
//! hashes as it goes (O(changed pages + pages removed)).

use crate::Error;
use crate::format::body::{DeltaBody, PATCH, RUNS, WHOLE, XOR};
use crate::format::checksum::{PageHashes, page_hash};
use crate::format::pages::canonical_page1;
use crate::rebuild::image::PageImage;

/// Little-endian first bytes of a standard zstd frame: a patch is exactly one such frame (no
/// legacy-format, skippable or concatenated frames, which the decoder would also take).
const ZSTD_FRAME_MAGIC: [u8; 4] = 0xFD2F_B528u32.to_le_bytes();

impl DeltaBody<'_> {
    /// Refuses a delta that grows a `base_pages` database by pages it does not carry whole: shipped
    /// deltas carry every page they add ([`crate::publish::delta::Delta::fill_growth`]), as whole pages (a page past
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
            return Err(Error::corrupt(
                self.object,
                format!(
                    "delta grows the database from {base_pages} to {} pages without carrying them",
                    self.db_pages
                ),
            ));
        }
        Ok(())
    }

    /// Applies the pages to `image` (the database at the delta's base, in memory or in a
    /// file, resized to `db_pages`) and updates `hashes` to match: XOR and patch pages decode
    /// against the base content, page 1 in canonical form. O(changed pages + pages removed),
    /// one page in memory at a time. The
    /// growth check ([`DeltaBody::check_growth`]) and the page size come first and change
    /// nothing when they fail; a later error leaves the image part-applied, to be dropped.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the delta grows the database by pages it does not carry
    /// whole, its page size differs from the image's, or a run or patch does not decode
    /// against its base.
    pub(crate) fn apply(
        &self,
        image: &mut dyn PageImage,
        hashes: &mut PageHashes,
    ) -> Result<(), Error> {
        self.check_growth(hashes.pages())?;
        if self.page_size != hashes.page_size() {
            return Err(Error::corrupt(
                self.object,
                "delta page size differs from the image's",
            ));
        }
        let ps = self.page_size as usize;
        let new = self.db_pages as usize;
        hashes.resize(new);
        image.set_len(new as u64 * ps as u64)?;
        // Taken at the first patch: most deltas have none.
        let mut dctx: Option<crate::format::blob::DCtx> = None;
        let mut scratch = Vec::with_capacity(ps);
        let mut buf = vec![0u8; ps];
        for (pgno, encoding, bytes) in self.records() {
            let at = (u64::from(pgno) - 1) * ps as u64;
            let page = buf.as_mut_slice();
            if encoding != WHOLE {
                image.read_at(self.object, at, page)?;
            }
            if pgno == 1 && encoding != WHOLE {
                canonical_page1(page);
            }
            match encoding {
                XOR => page.iter_mut().zip(bytes).for_each(|(o, x)| *o ^= x),
                RUNS => apply_runs(page, bytes).ok_or_else(|| {
                    Error::corrupt(
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
                        dctx.get_or_insert_with(crate::format::blob::DCtx::take)
                            .get()
                            .decompress_using_dict(&mut scratch, bytes, page)
                            .ok()
                    } else {
                        None
                    };
                    if decoded != Some(ps) {
                        return Err(Error::corrupt(
                            self.object,
                            format!("delta page {pgno}: patch does not decode against its base"),
                        ));
                    }
                    page.copy_from_slice(&scratch);
                }
                _ => page.copy_from_slice(bytes),
            }
            image.write_at(self.object, at, page)?;
            hashes.set(pgno, page_hash(pgno, page));
        }
        if let Some(dctx) = dctx {
            dctx.keep(ps);
        }
        Ok(())
    }
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
