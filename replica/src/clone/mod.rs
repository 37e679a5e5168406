//! Cloning an org by reference (`docs/design.md` 2e): the clone's first snapshot names the
//! source snapshot's segments instead of copying them, a clone reference in the source's
//! `refs/` keeps them from the source's retention, and one delta of whole pages takes that
//! snapshot to the position cloned. What a clone reads and writes depends on what changed
//! since the snapshot, not on the database's size.
//!
//! ```text
//! plan (a restore's): snapshot S of SRC + level sections + deltas up to the position
//! sparse rebuild: only the segments of S the chain touches      (every check of a restore)
//! PUT orgs/<origin>/refs/<dst>.json for each org whose segments S names
//! GET SRC's entry S: still there, so no retention run that could free S's segments
//!   listed the references before ours landed                    (else: refused, nothing published)
//! PUT DST manifest (version 2: "<origin>/<segment>") -> create DST's snapshot entry
//! create DST's delta entry: S -> the position, whole pages
//! ```

mod rebuild;

use std::collections::BTreeMap;

use object_store::{ObjectStoreExt, PutPayload};
use tracing::{info, warn};

use crate::format::blob::pack;
use crate::format::clone_ref::{CLONE_REF_VERSION, CloneRef};
use crate::format::entry::{BlobRef, DeltaLink, EntryBody, Stored};
use crate::format::segment::{Manifest, SegmentRef};
use crate::{Claim, Error, FailPoint, LogEntry, OrgId, Replica, Shipped};
use rebuild::{Patch, Patched};

/// A clone published by reference: what [`Replica::clone_into`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cloned {
    /// The source position the clone holds.
    pub position: u64,
    /// The source snapshot whose segments the clone names.
    pub source_snapshot: u64,
    /// The commit counter at the position.
    pub commit: u64,
    /// The clone's snapshot entry (its segments are the source's; `uploaded_bytes` is its
    /// manifest's size).
    pub snapshot: Shipped,
    /// The clone's delta from that snapshot to the position; `None` when the position is
    /// the snapshot itself.
    pub delta: Option<Shipped>,
    /// Segments named, not copied.
    pub shared_segments: usize,
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
        let patch = match self.clone_patch(src, &plan, &manifest).await? {
            Patched::TooLarge => {
                return Ok(CloneOutcome::Copy(
                    "its changes since the snapshot pass 64 MiB",
                ));
            }
            Patched::Unchanged => None,
            Patched::Patch(p) => Some(p),
        };
        let refs = self
            .write_clone_refs(src, &plan.snapshot, &manifest, &dst)
            .await?;
        if let Err(e) = self.failpoint(FailPoint::CloneAfterReferences, &dst).await {
            self.drop_clone_refs(&refs, &dst).await;
            return Err(e);
        }
        // The snapshot's entry is still in the log after our references landed: a retention
        // run that frees its segments deletes that entry before it lists the references
        // (`retention`), so it lists ours (2e).
        let entry = self.inner.store.layout.log(src, plan.snapshot.seq());
        if self.get_bytes(&entry).await?.is_none() {
            self.drop_clone_refs(&refs, &dst).await;
            return Err(Error::PositionNotKept {
                org: src.to_string(),
                seq: plan.position,
                before: None,
                after: None,
            });
        }
        let shared = Manifest {
            v: crate::format::segment::MANIFEST_VERSION_SHARED,
            segments: manifest
                .segments
                .iter()
                .map(|s| match s.origin() {
                    Some(_) => s.clone(),
                    None => SegmentRef(format!("{src}/{}", s.name()), s.compressed_bytes()),
                })
                .collect(),
            ..manifest
        };
        let seq = claim.next_seq();
        let snapshot = match self.publish_shared(claim, &shared, &stored).await {
            Ok(s) => s,
            Err(e) => {
                // Nothing names the references when the snapshot's entry surely did not
                // land: its manifest was not uploaded, or a later claim of DST fenced it
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
        let delta = match patch {
            Some(p) => Some(self.publish_patch(claim, &snapshot, p, plan.commit).await?),
            None => None,
        };
        info!(%src, %dst, position = plan.position, segments = shared.segments.len(),
              "cloned by reference");
        Ok(CloneOutcome::Shared(Box::new(Cloned {
            position: plan.position,
            source_snapshot: plan.snapshot.seq(),
            commit: plan.commit,
            snapshot,
            delta,
            shared_segments: shared.segments.len(),
        })))
    }

    /// Writes a clone reference for `dst` into the folder of every org whose segments
    /// `manifest` (of `snapshot` of `src`) names; returns those orgs.
    async fn write_clone_refs(
        &self,
        src: &OrgId,
        snapshot: &LogEntry,
        manifest: &Manifest,
        dst: &OrgId,
    ) -> Result<Vec<OrgId>, Error> {
        let mut by_origin: BTreeMap<OrgId, Vec<String>> = BTreeMap::new();
        for s in &manifest.segments {
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

    /// Uploads `manifest` and publishes the clone's snapshot entry: the source snapshot's
    /// image (`stored`: its size, sha256 and commit) under the claim's round.
    async fn publish_shared(
        &self,
        claim: &mut Claim,
        manifest: &Manifest,
        stored: &Stored,
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
                sha256: stored.sha256.clone(),
                bytes: stored.bytes,
                compressed_bytes: manifest.compressed_bytes(),
                commit: stored.commit,
            }),
        };
        self.publish_for_claim(claim, &entry).await?;
        Ok(Shipped {
            seq,
            delta: false,
            round,
            commit: stored.commit,
            bytes: stored.bytes,
            compressed_bytes: manifest.compressed_bytes(),
            uploaded_bytes: manifest_len,
            sha256: stored.sha256.clone(),
            blob: path.to_string(),
        })
    }

    /// Publishes `patch` as the delta after the clone's `snapshot`.
    async fn publish_patch(
        &self,
        claim: &mut Claim,
        snapshot: &Shipped,
        patch: Patch,
        commit: u64,
    ) -> Result<Shipped, Error> {
        let org = claim.org().to_string();
        let level = self.inner.settings.zstd_level;
        let body = patch.body;
        let packed =
            crate::replica::blocking("packing a delta", move || pack(&org, "delta", &body, level))
                .await?;
        let in_blob = packed.blob.len() > self.inner.settings.inline_delta_bytes;
        let link = DeltaLink {
            stored: Stored {
                blob: BlobRef::Object(String::new()),
                sha256: String::new(),
                bytes: 0,
                compressed_bytes: 0,
                commit,
            },
            base: snapshot.seq,
            base_checksum: patch.base_checksum,
            checksum: patch.checksum,
            page_size: patch.page_size,
            db_pages: patch.db_pages,
            changed_pages: patch.changed_pages,
        };
        self.upload_and_publish(claim, packed, in_blob, commit, |stored| {
            EntryBody::Delta(DeltaLink {
                stored,
                ..link.clone()
            })
        })
        .await
    }
}
