//! Shipping: publishing a full snapshot or a delta under a claim's round (I6, I7, I9, I11).
//!
//! ```text
//! snapshot: stream segments (read, hash, zstd; new ones PUT, unchanged ones named),
//!   the manifest PUT beside the last uploads -> create log/<next> (create-only;
//!   settled by re-reading, see `log`)
//! delta:    pack (sha256 + zstd) -> put blob, unless small enough to go inside its entry
//!   -> create log/<next>
//! ```
//!
//! No LIST after the create: a create that lands in the slot after this writer's own last
//! entry proves no successor has claimed (see `docs/design.md`, "Store requests per
//! acknowledgement"): a successor's claim is created in the slot after the last entry it
//! read, retention never frees a claim, release or the newest entry, so a claim that came
//! first holds that very slot and the create collides (Fenced).

use std::sync::Arc;

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use object_store::{ObjectStoreExt, PutPayload};
use tracing::info;

use crate::chain::position::Tip;
use crate::format::blob::{Packed, pack};
use crate::format::checksum::checksum_hex;
use crate::format::entry::MAX_SHIP_WINDOW;
use crate::format::entry::{BlobRef, DeltaLink, EntryBody, Stored};
use crate::format::layout::{delta_blob_name, new_nonce};
use crate::publish::source::{FileSource, MemSource, PageSource};
use crate::replica::blocking;
use crate::{Claim, Delta, Error, FailPoint, LogEntry, Replica, Snapshot};

/// A delta checked against its base and packed, not yet published.
pub(crate) struct PackedDelta {
    pub(crate) packed: Packed,
    /// The entry's link; its `stored` is filled in when the body's place is known.
    pub(crate) link: DeltaLink,
    pub(crate) commit: u64,
    /// The base's page hashes, and what the delta changes in them.
    pub(crate) base_hashes: Arc<crate::format::checksum::PageHashes>,
    pub(crate) change: crate::format::checksum::HashChange,
}

/// A published snapshot or delta: where it is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipped {
    /// Log position of the entry.
    pub seq: u64,
    /// True for a delta, false for a full snapshot.
    pub delta: bool,
    /// Round it was published under.
    pub round: u64,
    /// The caller's commit counter contained in it.
    pub commit: u64,
    /// Uncompressed size in bytes (database image, or delta body).
    pub bytes: u64,
    /// Packed size in bytes: of the delta's blob or body; of every segment of a snapshot
    /// together (what a hydrate of it downloads).
    pub compressed_bytes: u64,
    /// Packed bytes this ship uploaded: a delta's body (in a blob or inside its entry); a
    /// snapshot's new segments and its manifest, not the segments it reused. For a listed
    /// entry (not just shipped), its `compressed_bytes`.
    pub uploaded_bytes: u64,
    /// sha256 of the uncompressed image or delta body, hex.
    pub sha256: String,
    /// Full object path of the blob; for a delta carried inline, of its log entry.
    pub blob: String,
}

impl Shipped {
    /// The snapshot or delta `entry` describes, its blob named by its full object path
    /// (`blob_path` of the blob's file name, or of `None` for an inline body: the entry's
    /// path); `None` for claims and releases.
    pub(crate) fn from_entry(
        entry: &LogEntry,
        blob_path: impl FnOnce(Option<&str>) -> String,
    ) -> Option<Shipped> {
        let stored = entry.stored()?;
        Some(Shipped {
            seq: entry.seq(),
            delta: entry.is_delta(),
            round: entry.round(),
            commit: stored.commit,
            bytes: stored.bytes,
            compressed_bytes: stored.compressed_bytes,
            uploaded_bytes: stored.compressed_bytes,
            sha256: stored.sha256.clone(),
            blob: blob_path(stored.blob.name()),
        })
    }
}

impl Replica {
    /// Publishes `snapshot` as a full snapshot at the claim's next seq: its pages stream out
    /// as segments ([`crate::format::segment`]), naming instead of uploading every segment the
    /// previous snapshot of the chain already holds, then its manifest, then a create-only
    /// Snapshot entry naming the manifest. Only an `Ok` means the snapshot is durably
    /// published under this round (I6), and a create that lands in the slot after the
    /// claim's own last entry proves no successor claimed (I7, I11). The snapshot becomes the
    /// claim's chain tip: later deltas apply to it.
    ///
    /// # Errors
    /// [`Error::Fenced`] when a newer entry holds our slot (I7, I11);
    /// [`Error::PublishUnknown`] when a publish could not be settled by re-reading (I9);
    /// both make the claim unusable. [`Error::Store`]/[`Error::Injected`] before publishing
    /// (retry the ship); [`Error::StoreRefused`]; [`Error::InvalidSnapshot`];
    /// [`Error::ClaimUnusable`].
    pub async fn ship(&self, claim: &mut Claim, snapshot: Snapshot) -> Result<Shipped, Error> {
        claim.usable()?;
        let org = claim.org().to_string();
        snapshot.check(&org)?;
        let commit = snapshot.commit();
        let source = MemSource::new(&org, Arc::new(snapshot.into_bytes()))?;
        self.ship_source(claim, Box::new(source), commit).await
    }

    /// [`Replica::ship`] of the SQLite database file at `path`, streamed from the file in
    /// bounded memory (nobody may write the file meanwhile): what an import publishes.
    /// `commit` is the caller's commit counter the file holds.
    ///
    /// # Errors
    /// As [`Replica::ship`]; [`Error::Io`] reading the file.
    pub async fn ship_file(
        &self,
        claim: &mut Claim,
        path: &std::path::Path,
        commit: u64,
    ) -> Result<Shipped, Error> {
        claim.usable()?;
        let org = claim.org().to_string();
        let p = path.to_path_buf();
        let source = blocking("opening a database file", move || {
            FileSource::open(&org, &p)
        })
        .await?;
        self.ship_source(claim, Box::new(source), commit).await
    }

    /// Ships the pages of `source` as a full snapshot holding `commit` (see
    /// [`Replica::ship`]). A failure forgets the previous snapshot's segments, so the next
    /// snapshot names none it did not upload itself (`docs/design.md`, "Segments and
    /// retention").
    pub(crate) async fn ship_source(
        &self,
        claim: &mut Claim,
        source: Box<dyn PageSource>,
        commit: u64,
    ) -> Result<Shipped, Error> {
        claim.usable()?;
        // W4: a snapshot is issued with nothing in flight, so no ship of the claim uploads
        // below it (retention's orphan rule, R4).
        claim.nothing_in_flight("a full snapshot")?;
        let listed = claim.take_resumed_below();
        if claim.may_look_up_reuse() {
            let reuse = self.inherited_manifest(claim, listed).await;
            claim.set_reuse(reuse);
        }
        let shipped = self.ship_segments(claim, source, commit).await;
        if shipped.is_err() {
            claim.lose_reuse();
        }
        shipped
    }

    /// The manifest of the newest snapshot below `claim`, for a claim that continues a
    /// chain without having hydrated it (it reused a local file, [`Replica::resume`]) and
    /// has shipped no snapshot of its own: that
    /// snapshot is the newest in the log while the claim can publish, so its segments may be
    /// named (`docs/design.md`, "Segments and retention"). Read only when the chain's
    /// database is several segments large; any failure just means uploading every segment.
    /// The tail is read from `listed`, the claimant's own listing of the log below the
    /// claim and the entries it read (kept by the resume): no LIST, and a GET only per entry
    /// of the tail that listing did not read (the log below a claim that passed its
    /// successor check changes only by retention's deletions, after which the tail is
    /// listed afresh: `docs/design.md`, section 3d).
    async fn inherited_manifest(
        &self,
        claim: &Claim,
        listed: Option<crate::fence::log::Window>,
    ) -> Option<Arc<crate::format::segment::Manifest>> {
        let tip = claim.tip()?;
        let segment = self.inner.settings.segment_bytes as u64;
        if (tip.hashes.pages() as u64) * u64::from(tip.hashes.page_size()) < 4 * segment {
            return None;
        }
        let tail = self
            .tail_seen(claim.org(), claim.seq(), listed)
            .await
            .ok()?;
        let snapshot = tail.iter().rev().find(|e| e.is_snapshot())?;
        let (name, stored) = (snapshot.manifest()?, snapshot.stored()?);
        let manifest = self
            .read_manifest(claim.org(), name, stored.bytes)
            .await
            .ok()?;
        Some(Arc::new(manifest))
    }

    async fn ship_segments(
        &self,
        claim: &mut Claim,
        source: Box<dyn PageSource>,
        commit: u64,
    ) -> Result<Shipped, Error> {
        let org = claim.org().clone();
        let started = idem_base::Stopwatch::start();
        let (seq, round) = (claim.next_seq(), claim.round());
        self.failpoint(FailPoint::ShipBeforeUpload, &org).await?;
        let reuse = claim.reuse().cloned();
        let streamed = self
            .upload_segments(&org, (seq, round), source, reuse.as_deref())
            .await?;
        let manifest = streamed.manifest;
        let name = streamed.manifest_name;
        let manifest_path = self.inner.store.layout.blob(&org, &name);
        let manifest_len = streamed.manifest_len;
        self.failpoint(FailPoint::ShipAfterUpload, &org).await?;
        let stored = Stored {
            blob: BlobRef::Manifest(name),
            sha256: streamed.sha256.clone(),
            bytes: manifest.bytes(),
            compressed_bytes: manifest.compressed_bytes(),
            commit,
        };
        let entry = LogEntry {
            header: claim.next_header(self.inner.clock.now_ms())?,
            body: EntryBody::Snapshot(stored),
        };
        self.publish_for_claim(claim, &entry).await?;
        self.failpoint(FailPoint::ShipAfterPublish, &org).await?;
        let uploaded_bytes = streamed.uploaded_bytes + manifest_len;
        info!(%org, round, seq, bytes = manifest.bytes(), uploaded_bytes,
              segments = manifest.segments.len(), reused = streamed.reused,
              elapsed_ms = started.elapsed_ms(), "shipped snapshot");
        let tip = Tip {
            seq,
            hashes: Arc::new(streamed.hashes),
        };
        claim.snapshot_published(tip);
        let shipped = Shipped {
            seq,
            delta: false,
            round,
            commit,
            bytes: manifest.bytes(),
            compressed_bytes: manifest.compressed_bytes(),
            uploaded_bytes,
            sha256: streamed.sha256,
            blob: manifest_path.to_string(),
        };
        // Retention on this handle then knows the snapshot's segments without reading them.
        let names = manifest.segments.iter().map(|s| s.0.clone()).collect();
        self.inner
            .segment_refs
            .insert(manifest_path.as_ref(), Arc::new(names));
        claim.set_reuse(Some(Arc::new(manifest)));
        Ok(shipped)
    }

    /// Ships the pages changed since the claim's chain tip: packs the delta body and
    /// publishes a create-only Delta entry naming the tip as its base with the database
    /// checksum before and after it. A packed body of at most
    /// [`Settings::inline_delta_bytes`](crate::Settings::inline_delta_bytes) goes inside the
    /// entry (one PUT per ship); a larger one is uploaded as a blob first (two PUTs). Costs
    /// O(changed pages), not O(database). Same acknowledgement and fencing rules as
    /// [`Replica::ship`] (I6, I7, I9).
    ///
    /// The first delta of a claim that [hydrated](Replica::hydrate) a chain continues it: its
    /// base is the previous round's tip, across the claims and releases between.
    ///
    /// A [compacted](Delta::compacted) delta names the chain's snapshot as its base instead,
    /// so a hydrate skips the deltas before it; it is refused unless applying it to the
    /// snapshot gives exactly the database the tip plus its pages gives, and unless the
    /// snapshot was shipped under this claim.
    ///
    /// # Errors
    /// [`Error::NoChainTip`] when the claim has no chain tip (it shipped no snapshot and
    /// hydrated none), or its last publish landed without its tip being recorded (ship a
    /// full snapshot); [`Error::DeltaRefused`] when the page size differs from
    /// the tip's, a page was [encoded](Delta::encode_against) against content the tip does
    /// not hold, or a compacted delta misses a page changed since the snapshot (nothing is
    /// published, the claim is unchanged: ship a full snapshot); otherwise as
    /// [`Replica::ship`].
    pub async fn ship_delta(&self, claim: &mut Claim, delta: Delta) -> Result<Shipped, Error> {
        claim.usable()?;
        claim.nothing_in_flight("a delta shipped alone")?;
        let Some(tip) = claim.delta_tip().cloned() else {
            return Err(Error::NoChainTip {
                org: claim.org().to_string(),
                round: claim.round(),
            });
        };
        let packed = self.pack_delta(claim, &tip, delta).await?;
        let in_blob = packed.packed.blob.len() > self.inner.settings.inline_delta_bytes;
        let link = packed.link.clone();
        let shipped = self
            .upload_and_publish(claim, packed.packed, in_blob, packed.commit, |stored| {
                EntryBody::Delta(DeltaLink {
                    stored,
                    ..link.clone()
                })
            })
            .await?;
        // Update the base's hashes in place: once the claim lets go of its tip, the table is
        // usually ours alone (a compaction, or the first delta after a snapshot, copies it once).
        drop(tip);
        claim.drop_tip();
        let mut hashes = packed.base_hashes;
        Arc::make_mut(&mut hashes).apply_change(packed.change);
        claim.delta_published(Tip {
            seq: shipped.seq,
            hashes,
        });
        Ok(shipped)
    }

    /// Checks `delta` against the claim's chain `tip` (its base: the tip, or for a compacted
    /// delta the claim's snapshot) and packs its body off the async runtime.
    ///
    /// # Errors
    /// [`Error::DeltaRefused`] as [`Replica::ship_delta`] says; [`Error::Compress`].
    pub(crate) async fn pack_delta(
        &self,
        claim: &Claim,
        tip: &Tip,
        delta: Delta,
    ) -> Result<PackedDelta, Error> {
        let org = claim.org().to_string();
        let seq = claim.next_seq();
        let refused = move |org: String, reason: String| Error::DeltaRefused { org, seq, reason };
        if delta.page_size() != tip.hashes.page_size() {
            return Err(refused(
                org,
                format!(
                    "delta page size {} but the database has {}",
                    delta.page_size(),
                    tip.hashes.page_size()
                ),
            ));
        }
        let level = self.inner.settings.zstd_level;
        let commit = delta.commit();
        let base = match (claim.snapshot_tip(), delta.is_compacted()) {
            (Some(snapshot), true) => snapshot.clone(),
            // A chain continued from an earlier round compacts only onto a snapshot of this
            // claim's own: the chain rules take a compaction of the snapshot's round only.
            (None, true) => {
                return Err(refused(
                    org,
                    "a compaction needs a snapshot shipped under this claim".into(),
                ));
            }
            (_, false) => tip.clone(),
        };
        let mut delta = delta;
        // The tip comparison must see the pages as the caller gave them: filled zero pages
        // would override the tip's content and hide a grown page the caller missed.
        let unfilled = delta.is_compacted().then(|| delta.clone());
        delta.fill_growth(base.hashes.pages());
        let (db_pages, page_size) = (delta.db_pages(), delta.page_size());
        let changed_pages = delta.changed_pages() as u32;
        let (tip_hashes, base_hashes) = (tip.hashes.clone(), base.hashes.clone());
        let (packed, change) = blocking("compressing a delta", move || {
            if let Some(page) = delta.wrong_base(&base_hashes) {
                return Err(refused(
                    org,
                    format!("page {page} was encoded against content the chain tip does not hold"),
                ));
            }
            let change = delta.hash_change(&base_hashes);
            if let Some(unfilled) = &unfilled
                && unfilled.hash_change(&tip_hashes).sum != change.sum
            {
                return Err(refused(
                    org,
                    "compacted delta misses a page changed since the snapshot".into(),
                ));
            }
            Ok((pack(&org, "delta", &delta.body(), level)?, change))
        })
        .await?;
        let link = DeltaLink {
            stored: Stored {
                blob: BlobRef::Inline(String::new()),
                sha256: String::new(),
                bytes: 0,
                compressed_bytes: 0,
                commit,
            },
            base: base.seq,
            base_checksum: checksum_hex(base.hashes.sum()),
            checksum: checksum_hex(change.sum),
            page_size,
            db_pages,
            changed_pages,
        };
        Ok(PackedDelta {
            packed,
            link,
            commit,
            base_hashes: base.hashes,
            change,
        })
    }

    /// Uploads a packed blob (when `in_blob`, named for the slot it is published at; else the
    /// packed bytes go inside the entry), publishes at the claim's next seq the entry whose
    /// body `body` builds from the blob's [`Stored`] fields and `commit`. A
    /// slot held by a stray (W5, `docs/design.md` 3e) is skipped: the blob is uploaded again
    /// under the next slot's name (the one named for the stray's slot is an orphan, R4).
    ///
    /// No successor check after the create: the create-only slot after the claim's own last
    /// entry already proves it (module docs; I7, I11).
    async fn upload_and_publish(
        &self,
        claim: &mut Claim,
        packed: Packed,
        in_blob: bool,
        commit: u64,
        body: impl Fn(Stored) -> EntryBody,
    ) -> Result<Shipped, Error> {
        let org = claim.org().clone();
        let started = idem_base::Stopwatch::start();
        let compressed_bytes = packed.blob.len() as u64;
        let inline = (!in_blob).then(|| BASE64_STANDARD.encode(&packed.blob));
        let payload = PutPayload::from(packed.blob);
        let mut strays = 0;
        // The failpoints around the upload fire for an inline body too, so the seams of
        // kill and pause tests stay where they are (nothing is uploaded between them).
        self.failpoint(FailPoint::ShipBeforeUpload, &org).await?;
        let (entry, blob_path) = loop {
            let (blob, blob_path) = match &inline {
                None => {
                    let name = delta_blob_name(claim.next_seq(), claim.round(), &new_nonce()?);
                    let blob_path = self.inner.store.layout.blob(&org, &name);
                    self.inner
                        .store
                        .object
                        .put(&blob_path, payload.clone())
                        .await
                        .map_err(|e| Error::store("put", &blob_path, e))?;
                    (BlobRef::Object(name), blob_path)
                }
                Some(text) => (
                    BlobRef::Inline(text.clone()),
                    self.inner.store.layout.log(&org, claim.next_seq()),
                ),
            };
            if strays == 0 {
                self.failpoint(FailPoint::ShipAfterUpload, &org).await?;
            }
            let entry = LogEntry {
                header: claim.next_header(self.inner.clock.now_ms())?,
                body: body(Stored {
                    blob,
                    sha256: packed.sha256.clone(),
                    bytes: packed.bytes,
                    compressed_bytes,
                    commit,
                }),
            };
            match self.publish_for_claim(claim, &entry).await {
                Ok(()) => break (entry, blob_path),
                Err(Error::SlotTaken { .. }) if strays < MAX_SHIP_WINDOW => strays += 1,
                Err(e) => return Err(e),
            }
        };
        let seq = entry.seq();
        self.failpoint(FailPoint::ShipAfterPublish, &org).await?;
        info!(%org, round = claim.round(), seq, kind = entry.kind_name(), bytes = packed.bytes,
              compressed_bytes, inline = entry.is_inline(), elapsed_ms = started.elapsed_ms(), "shipped");
        Ok(Shipped {
            seq,
            delta: entry.is_delta(),
            round: claim.round(),
            commit,
            bytes: packed.bytes,
            compressed_bytes,
            uploaded_bytes: compressed_bytes,
            sha256: packed.sha256,
            blob: blob_path.to_string(),
        })
    }
}
