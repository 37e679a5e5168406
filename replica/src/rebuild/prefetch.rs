//! The hydrate of a claim, downloaded beside the claim's own requests (I8, I10, I16).
//!
//! The claim's first LIST and its read of the top entries ([`Window`]) already name the chain
//! a hydrate of the claim would install, whenever the window holds that chain's whole tail.
//! [`Replica::claim_to_hydrate`] then rebuilds that chain in memory while the claim's PUT and
//! its successor check are in flight. The image is only a candidate: a claim that does not
//! land drops it, and the hydrate installs it only when the chain it computes itself (from
//! the same listing, after the check showed nothing above the claim) is this very chain
//! (`docs/design.md`, section 3d). Nothing reaches the local disk before then.

use std::path::Path;

use crate::chain::{self, Chain};
use crate::fence::log::Window;
use crate::format::layout::new_nonce;
use crate::rebuild::hydrate::{Hydrated, Installed, Rebuilt};
use crate::rebuild::image::{FileImage, PageImage};
use crate::rebuild::install::{Check, temp_beside};
use crate::{Error, OrgId, Replica};

/// A chain rebuilt and verified in memory before its claim landed.
pub(crate) struct Prefetched {
    /// The chain the image holds.
    pub(crate) chain: Chain,
    /// The verified image, its page hashes and its snapshot's manifest.
    pub(crate) rebuilt: Rebuilt<Vec<u8>>,
}

impl std::fmt::Debug for Prefetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetched")
            .field("position", &self.chain.position())
            .field("bytes", &self.rebuilt.image.len())
            .finish()
    }
}

impl Prefetched {
    /// True when `chain` is the one this image holds, entry for entry.
    pub(crate) fn holds(&self, chain: &Chain) -> bool {
        self.chain.snapshot == chain.snapshot && self.chain.deltas == chain.deltas
    }
}

impl Replica {
    /// The chain a hydrate of a claim landing at `slot` (`window.head() + 1`, or lower under a
    /// pipelined writer's strays, `docs/design.md` 3e) would install, when
    /// `window` holds every entry of its tail (no store request is needed to find it) and its
    /// image fits in what the hydrate's own downloads hold in flight: `read_concurrency`
    /// segments. `None` otherwise, and for an org with nothing published.
    pub(crate) async fn prefetch_plan(
        &self,
        org: &OrgId,
        window: &Window,
        slot: u64,
    ) -> Option<Chain> {
        let limit = slot;
        let tail = self.tail_held(org, limit, window).await?;
        let chain = chain::newest(org, &tail, limit).ok()??;
        let settings = &self.inner.settings;
        let bound =
            (settings.segment_bytes as u64).saturating_mul(settings.read_concurrency.max(1) as u64);
        // An upper bound of the image: the snapshot's bytes plus every page a delta carries.
        let bytes = std::iter::once(&chain.snapshot)
            .chain(&chain.deltas)
            .map(|e| e.stored().map_or(u64::MAX, |s| s.bytes))
            .fold(0u64, u64::saturating_add);
        (bytes <= bound).then_some(chain)
    }

    /// Rebuilds `chain` in memory with every check a hydrate makes (sizes, sha256, the
    /// database checksum before and after each delta). `None` on any failure: the hydrate
    /// then reads the chain itself, exactly as without a prefetch, and reports what it finds.
    pub(crate) async fn prefetch(&self, org: &OrgId, chain: Chain) -> Option<Prefetched> {
        match self.rebuild(org, &chain, Vec::new()).await {
            Ok(rebuilt) => Some(Prefetched { chain, rebuilt }),
            Err(e) => {
                tracing::debug!(%org, position = chain.position(), error = %e, "prefetch dropped");
                None
            }
        }
    }

    /// Installs at `dest` an image [`Replica::claim_to_hydrate`] rebuilt and verified in
    /// memory: written into a temp file beside `dest`, then checked (as `check` says) and
    /// renamed as a downloaded one is. Returns what a hydrate installed.
    pub(crate) async fn install_held(
        &self,
        org: &OrgId,
        held: Prefetched,
        dest: &Path,
        check: Check,
    ) -> Result<(Hydrated, Option<Installed>), Error> {
        let Prefetched { chain, rebuilt } = held;
        let nonce = new_nonce()?;
        let tmp = temp_beside(dest, &nonce)?;
        let t = tmp.clone();
        let write = move || {
            let mut file = FileImage::create(&t)?;
            let object = rebuilt.object.clone();
            file.set_len(rebuilt.image.len() as u64)?;
            file.write_at(&object, 0, &rebuilt.image)?;
            Ok(Rebuilt {
                image: file,
                object,
                hashes: rebuilt.hashes,
                manifest: rebuilt.manifest,
            })
        };
        self.install_rebuilt(org, chain, write, tmp, dest, check)
            .await
    }
}
