//! Encoding a delta's pages against their content at its base: a changed page ships as the
//! spans that differ, or as a zstd patch, instead of whole (the body format is `format/body.rs`).

use super::Delta;
use crate::format::body::{PATCH, RUNS, XOR};
use crate::format::checksum::page_hash;
use crate::format::pages::canonical_page1;

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

/// A page encoded against its content at the delta's base.
#[derive(Clone)]
pub(super) struct Encoded {
    /// [`RUNS`], [`XOR`] or [`PATCH`].
    pub(super) kind: u8,
    /// The record's bytes after its kind (and length, for runs and patches).
    pub(super) bytes: Vec<u8>,
    /// Hash of the base content used, which [`crate::Replica::ship_delta`] checks against
    /// the chain tip before publishing.
    pub(super) base_hash: u64,
}

impl Delta {
    /// Encodes every page whose content at the base position `base` knows against that
    /// content: as the spans that differ when they take at most 64 bytes, else as a zstd
    /// patch (about the page's new bytes, even when cells moved within the page), else —
    /// when the patch is no smaller than the spans — as the spans again. `base` must
    /// return the page exactly as the base position holds it — the content the previous
    /// published delta or snapshot left — or `None` (the page ships whole); hydrate decodes
    /// against the page it rebuilt, and the database checksum after the delta proves the
    /// result (I10). Page 1 bases are used in canonical form. A compacted delta is returned
    /// as is (its pages ship whole).
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
