//! Cloning an org by reference (`docs/design.md` 2e): the clone's one snapshot is the
//! source's state at the position, named by a manifest whose unchanged segments are the
//! source snapshot's (named, not copied; a clone reference in each origin's `refs/` keeps
//! them from its retention) and whose segments holding a changed page are new. What a clone
//! reads and writes follows what changed since the source's snapshot, not the database's
//! size, and it publishes one entry: a clone that fails publishes nothing.
//!
//! ```text
//! plan (a restore's): snapshot S of SRC + level sections + deltas up to the position P
//! sparse rebuild: only the segments of S the chain touches      (every check of a restore)
//! PUT orgs/<origin>/refs/<dst>.json for each org whose segments the clone names
//! GET SRC's entry S: still there, so no retention run that could free S's segments
//!   listed the references before ours landed                    (else: refused, nothing published)
//! PUT DST's new segments (S's pages with P's changes) and its manifest (version 2)
//! create DST's snapshot entry: P's image, in one create
//! ```

mod rebuild;
mod segments;

use std::collections::BTreeMap;

use object_store::{ObjectStoreExt, PutPayload};
use tracing::{info, warn};

use crate::format::clone_ref::{CLONE_REF_VERSION, CloneRef};
use crate::format::entry::{BlobRef, EntryBody, Stored};
use crate::format::segment::{Manifest, SegmentRef};
use crate::{Claim, Error, FailPoint, LogEntry, OrgId, Replica, Shipped};
use rebuild::Patched;
use segments::{Slot, slots};

/// A clone published by reference: what [`Replica::clone_into`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cloned {
    /// The source position the clone holds.
    pub position: u64,
    /// The source snapshot whose segments the clone names.
    pub source_snapshot: u64,
    /// The commit counter at the position.
    pub commit: u64,
    /// The clone's snapshot entry: the position's image. `uploaded_bytes` counts its new
    /// segments and its manifest; `sha256` is empty (2e: the manifest authenticates it).
    pub snapshot: Shipped,
    /// Segments named, not copied.
    pub shared_segments: usize,
    /// Segments uploaded: those holding a page changed since the source's snapshot.
    pub uploaded_segments: usize,
}

/// The answer of [`Replica::clone_into`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloneOutcome {
    /// Published by reference.
    Shared(Box<Cloned>),
    /// Nothing was written: this position cannot be cloned by reference, for the reason
    /// given; the caller restores it and ships it as a full snapshot instead.
    Copy(&'static str),
}

impl Replica {
    /// Makes the org of `claim` (a fresh claim that has published nothing) a clone of
    /// `src` at the position `at` (its newest for `None`), by reference
    /// (`docs/design.md` 2e): its snapshot names the segments of `src`'s snapshot below the
    /// position, kept by a clone reference in the folder of each org that uploaded them,
    /// and one delta of whole pages takes it to the position. Reads the chain as a restore
    /// does, but only the snapshot segments its changes touch; writes the references, a
    /// manifest and one or two log entries. The caller releases the claim.
    ///
    /// Returns [`CloneOutcome::Copy`] (nothing written) for a snapshot stored whole by an
    /// earlier build, or changes since the snapshot above [`crate::MAX_LEVEL_BYTES`].
    ///
    /// # Errors
    /// [`Error::ClaimUnusable`] for a claim that published anything, or of `src` itself;
    /// [`Error::NoSuchSnapshot`] and [`Error::PositionNotKept`] as a restore of `at`;
    /// [`Error::PositionNotKept`] also when retention retired the snapshot while the
    /// references were written (nothing published; clone another position); a chain that
    /// fails its checks ([`Error::ChainBroken`], [`Error::Corrupt`]); store errors; the
    /// claim's publish errors ([`Error::Fenced`], [`Error::PublishUnknown`]).
    pub async fn clone_into(
        &self,
        claim: &mut Claim,
        src: &OrgId,
        at: Option<u64>,
    ) -> Result<CloneOutcome, Error> {
        self.writable("clone")?;
        claim.usable()?;
        let dst = claim.org().clone();
        // A fresh claim's next slot is the one after its own entry, and it holds no tip.
        if &dst == src || claim.next_seq() != claim.seq() + 1 || claim.tip().is_some() {
            return Err(Error::ClaimUnusable {
                org: dst.to_string(),
                round: claim.round(),
                reason: "a clone needs a fresh claim of another org",
            });
        }
        // Round 1 only: the references of a clone of DST are one object per origin
        // (`refs/<dst>.json`), so a second clone of DST under a later round would share them
        // with the first, which deletes them when it gives up (docs/clone-attack.md, ATK-3).
        if claim.round() != 1 {
            return Err(Error::ClaimUnusable {
                org: dst.to_string(),
                round: claim.round(),
                reason: "a clone needs the first claim of a new org (round 1)",
            });
        }
        let plan = self.clone_plan(src, at).await?;
        let Some(stored) = plan.snapshot.stored().cloned() else {
            return Err(Error::NoSuchSnapshot {
                org: src.to_string(),
                seq: plan.snapshot.seq(),
            });
        };
        let BlobRef::Manifest(name) = &stored.blob else {
            return Ok(CloneOutcome::Copy(
                "its snapshot is stored whole (an earlier build)",
            ));
        };
        let manifest = self.read_manifest(src, name, stored.bytes).await?;
        if manifest
            .segments
            .iter()
            .any(|s| s.origin() == Some(dst.as_str()))
        {
            return Ok(CloneOutcome::Copy(
                "its snapshot names the clone's own segments",
            ));
        }
        let rebuilt = match self.clone_image(src, &plan, &manifest).await? {
            Patched::TooLarge => {
                return Ok(CloneOutcome::Copy(
                    "its changes since the snapshot pass 64 MiB",
                ));
            }
            Patched::Rebuilt(r) => r,
        };
        let slots = slots(&manifest, &rebuilt);
        let named: Vec<SegmentRef> = slots
            .iter()
            .filter_map(|s| match s {
                Slot::Named(seg) => Some(seg.clone()),
                Slot::Built { .. } => None,
            })
            .collect();
        let refs = self
            .write_clone_refs(src, &plan.snapshot, &named, &dst)
            .await?;
        if let Err(e) = self.failpoint(FailPoint::CloneAfterReferences, &dst).await {
            self.drop_clone_refs(&refs, &dst).await;
            return Err(e);
        }
        // The snapshot's entry is still in the log after our references landed: a retention
        // run that frees its segments deletes that entry before it lists the references
        // (`retention`), so it lists ours (2e).
        let entry = self.inner.store.layout.log(src, plan.snapshot.seq());
        if self
            .get_bytes(&entry, crate::format::entry::MAX_ENTRY_BYTES)
            .await?
            .is_none()
        {
            self.drop_clone_refs(&refs, &dst).await;
            return Err(Error::PositionNotKept {
                org: src.to_string(),
                seq: plan.position,
                before: None,
                after: None,
            });
        }
        let seq = claim.next_seq();
        let built = slots
            .iter()
            .filter(|s| matches!(s, Slot::Built { .. }))
            .count();
        let published = async {
            let (segments, uploaded) = self
                .upload_clone_segments(src, &dst, (seq, claim.round()), &manifest, slots)
                .await?;
            // Always version 2: a clone's snapshot records no whole-image sha256, which
            // only a version 2 manifest allows (2e).
            let image = Manifest {
                v: crate::format::segment::MANIFEST_VERSION_SHARED,
                page_size: manifest.page_size,
                pages: rebuilt.db_pages,
                segment_pages: manifest.segment_pages,
                segments,
            };
            self.publish_shared(claim, &image, plan.commit, uploaded)
                .await
        }
        .await;
        let snapshot = match published {
            Ok(s) => s,
            Err(e) => {
                // Nothing names the references when the snapshot's entry surely did not
                // land: its objects were not all uploaded, or a later claim of DST fenced it
                // (a claim of round 2 or above, which clones nothing: above). A refused or
                // unknown publish may still land, and keeps them (docs/clone-attack.md,
                // ATK-2).
                if claim.next_seq() == seq
                    && matches!(e, Error::Fenced { .. } | Error::Store { .. })
                {
                    self.drop_clone_refs(&refs, &dst).await;
                }
                return Err(e);
            }
        };
        info!(%src, %dst, position = plan.position, shared = named.len(), uploaded = built,
              "cloned by reference");
        Ok(CloneOutcome::Shared(Box::new(Cloned {
            position: plan.position,
            source_snapshot: plan.snapshot.seq(),
            commit: plan.commit,
            snapshot,
            shared_segments: named.len(),
            uploaded_segments: built,
        })))
    }

    /// Writes a clone reference for `dst` into the folder of every org that uploaded one of
    /// `named` (segments of the manifest of `snapshot` of `src`, as it names them); returns
    /// those orgs.
    async fn write_clone_refs(
        &self,
        src: &OrgId,
        snapshot: &LogEntry,
        named: &[SegmentRef],
        dst: &OrgId,
    ) -> Result<Vec<OrgId>, Error> {
        let mut by_origin: BTreeMap<OrgId, Vec<String>> = BTreeMap::new();
        for s in named {
            let origin = match s.origin() {
                None => src.clone(),
                Some(o) => OrgId::new(o).map_err(|e| Error::corrupt(s.name(), e.to_string()))?,
            };
            by_origin
                .entry(origin)
                .or_default()
                .push(s.file().to_owned());
        }
        let mut written = Vec::with_capacity(by_origin.len());
        for (origin, mut segments) in by_origin {
            segments.sort_unstable();
            segments.dedup();
            let r = CloneRef {
                v: CLONE_REF_VERSION,
                org: origin.to_string(),
                clone: dst.to_string(),
                snapshot: snapshot.seq(),
                segments,
            };
            let path = self.inner.store.layout.clone_ref(&origin, dst);
            let put = self
                .inner
                .store
                .object
                .put(&path, PutPayload::from(r.encode()?))
                .await;
            if let Err(e) = put {
                self.drop_clone_refs(&written, dst).await;
                return Err(Error::store("put", &path, e));
            }
            written.push(origin);
        }
        Ok(written)
    }

    /// Deletes the clone references of `dst` in `origins` (nothing names them yet); a
    /// failure leaves a reference that only keeps segments longer.
    async fn drop_clone_refs(&self, origins: &[OrgId], dst: &OrgId) {
        for origin in origins {
            let path = self.inner.store.layout.clone_ref(origin, dst);
            if let Err(e) = self.delete(&path).await {
                warn!(%origin, %dst, error = %e, "an unused clone reference stays");
            }
        }
    }

    /// Uploads `manifest` and publishes the clone's snapshot entry: the position's image
    /// (its size and commit counter) under the claim's round. Its `sha256` is empty: the
    /// clone never holds the whole image, and the manifest, named by its sha256, names
    /// every segment by the sha256 of its pages (2e). `uploaded` counts the new segments'
    /// packed bytes.
    async fn publish_shared(
        &self,
        claim: &mut Claim,
        manifest: &Manifest,
        commit: u64,
        uploaded: u64,
    ) -> Result<Shipped, Error> {
        let org = claim.org().clone();
        let (seq, round) = (claim.next_seq(), claim.round());
        let (name, bytes) = manifest.encode(seq, round)?;
        let manifest_len = bytes.len() as u64;
        let path = self.inner.store.layout.blob(&org, &name);
        self.inner
            .store
            .object
            .put(&path, PutPayload::from(bytes))
            .await
            .map_err(|e| Error::store("put", &path, e))?;
        let entry = LogEntry {
            header: claim.next_header(self.inner.clock.now_ms())?,
            body: EntryBody::Snapshot(Stored {
                blob: BlobRef::Manifest(name),
                sha256: String::new(),
                bytes: manifest.bytes(),
                compressed_bytes: manifest.compressed_bytes(),
                commit,
            }),
        };
        self.publish_for_claim(claim, &entry).await?;
        Ok(Shipped {
            seq,
            delta: false,
            round,
            commit,
            bytes: manifest.bytes(),
            compressed_bytes: manifest.compressed_bytes(),
            uploaded_bytes: uploaded + manifest_len,
            sha256: String::new(),
            blob: path.to_string(),
        })
    }
}
