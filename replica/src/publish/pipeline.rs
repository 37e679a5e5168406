//! Pipelined ships (`docs/design.md` 3e): several deltas of one claim in flight at once, each
//! a create-only entry in the next slot, acknowledged in slot order.
//!
//! ```text
//! issue_delta(&mut claim, delta)     takes the next slot; packs against the newest landed
//!                                    position, so the body holds every page since it (W1)
//! land(&ship)                        uploads and creates; no claim borrowed, so several run
//!                                    at once
//! settle(&mut claim, ship, landing)  records the outcome; returns what is acknowledged now:
//!                                    the commits of the longest prefix of slots resolved as
//!                                    ours or as strays (W2); any failure ends the claim (W3)
//! ```
//!
//! The caller keeps every page changed since the newest landed position pending, and puts
//! them all in each delta it issues: a ship that never lands then loses nothing, because
//! every later one carries its pages too (W1), and a slot held by a stray (W5) needs no
//! re-publish of its own.

use std::sync::Arc;

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use tracing::{debug, warn};

use crate::chain::position::Tip;
use crate::fence::log::Published;
use crate::format::checksum::PageHashes;
use crate::format::entry::{BlobRef, DeltaLink, EntryBody, Stored};
use crate::format::layout::{delta_blob_name, new_nonce};
use crate::publish::ship::Shipped;
use crate::{Claim, Delta, Error, LogEntry, OrgId, Replica};

/// One pipelined ship, issued under a claim and not yet settled: its slot, its entry and
/// its blob. Not `Clone`: it is settled once.
#[derive(Debug)]
pub struct InFlight {
    org: OrgId,
    round: u64,
    claim_seq: u64,
    entry: LogEntry,
    blob: Option<(Path, PutPayload)>,
    hashes: Arc<PageHashes>,
    shipped: Shipped,
}

impl InFlight {
    /// The log position (slot) the ship is published at.
    pub fn seq(&self) -> u64 {
        self.entry.seq()
    }

    /// The caller's commit counter the ship holds.
    pub fn commit(&self) -> u64 {
        self.shipped.commit
    }

    /// What the ship publishes, as [`Replica::ship_delta`] reports it.
    pub fn shipped(&self) -> &Shipped {
        &self.shipped
    }
}

/// The outcome of [`Replica::land`].
#[derive(Debug)]
pub enum Landing {
    /// The entry landed in its slot (or an earlier try of it had, I9).
    Landed,
    /// The slot holds a stray: a pipelined ship of the writer this claim fenced (W5). The
    /// ship's pages go with the next ship.
    Stray,
    /// Anything else: fenced, an unknown outcome, a refused or failed put (W3).
    Failed(Error),
}

/// What [`Replica::settle`] acknowledges: every commit up to `commit`, held by the entry at
/// `seq` (I6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acked {
    /// Log position of the newest landed entry of the acknowledged prefix.
    pub seq: u64,
    /// The commit counter it holds.
    pub commit: u64,
}

impl Replica {
    /// Issues `delta` as the next pipelined ship of `claim`: takes the claim's next slot and
    /// packs the delta against the newest position of the claim that landed (or the one it
    /// hydrated), which is the base its entry names (W1). `delta` must hold every page
    /// changed since that position. Publishes nothing: [`Replica::land`] does.
    ///
    /// # Errors
    /// [`Error::InvalidSettings`] when the claim is not pipelined (its window is 1), its
    /// window is full, or it is in doubt with a ship in flight (W3: window 1 while in doubt);
    /// [`Error::NoChainTip`] when it has no position to base on (ship a full snapshot);
    /// [`Error::ClaimUnusable`]; otherwise as [`Replica::ship_delta`]'s checks.
    pub async fn issue_delta(&self, claim: &mut Claim, delta: Delta) -> Result<InFlight, Error> {
        claim.usable()?;
        // W1: every slot issued is below the lowest unresolved one plus the window, so a
        // successor claiming at that floor covers every ship of ours with its strays' range
        // (R1). Counting ships in flight is not enough: landed slots above an unresolved one
        // still take room.
        if claim.ship_window() < 2 || claim.room() == 0 {
            return Err(Error::InvalidSettings {
                reason: format!(
                    "a pipelined ship at slot {} with slot {} unresolved, under a claim of window {}",
                    claim.next_seq(),
                    claim.floor(),
                    claim.ship_window()
                ),
            });
        }
        let Some(tip) = claim.tip().cloned() else {
            return Err(Error::NoChainTip {
                org: claim.org().to_string(),
                round: claim.round(),
            });
        };
        let packed = self.pack_delta(claim, &tip, delta).await?;
        let org = claim.org().clone();
        let slot = claim.next_seq();
        let compressed_bytes = packed.packed.blob.len() as u64;
        let (blob_ref, blob, blob_path) =
            if packed.packed.blob.len() > self.inner.settings.inline_delta_bytes {
                let name = delta_blob_name(slot, claim.round(), &new_nonce()?);
                let path = self.inner.store.layout.blob(&org, &name);
                let payload = PutPayload::from(packed.packed.blob);
                (BlobRef::Object(name), Some((path.clone(), payload)), path)
            } else {
                let text = BASE64_STANDARD.encode(&packed.packed.blob);
                (
                    BlobRef::Inline(text),
                    None,
                    self.inner.store.layout.log(&org, slot),
                )
            };
        let entry = LogEntry {
            header: claim.next_header(self.inner.clock.now_ms())?,
            body: EntryBody::Delta(DeltaLink {
                stored: Stored {
                    blob: blob_ref,
                    sha256: packed.packed.sha256.clone(),
                    bytes: packed.packed.bytes,
                    compressed_bytes,
                    commit: packed.commit,
                },
                ..packed.link
            }),
        };
        claim.issue();
        let mut hashes = packed.base_hashes;
        Arc::make_mut(&mut hashes).apply_change(packed.change);
        let shipped = Shipped {
            seq: slot,
            delta: true,
            round: claim.round(),
            commit: packed.commit,
            bytes: packed.packed.bytes,
            compressed_bytes,
            uploaded_bytes: compressed_bytes,
            sha256: packed.packed.sha256,
            blob: blob_path.to_string(),
        };
        Ok(InFlight {
            org,
            round: claim.round(),
            claim_seq: claim.seq(),
            entry,
            blob,
            hashes,
            shipped,
        })
    }

    /// Publishes an issued ship: uploads its blob (if its body is not inline) and creates
    /// its entry, settled by re-reading on any doubt (I9). Borrows no claim, so the ships
    /// of one claim land concurrently, in any order.
    pub async fn land(&self, ship: &InFlight) -> Landing {
        if let Some((path, payload)) = &ship.blob
            && let Err(e) = self.inner.store.object.put(path, payload.clone()).await
        {
            return Landing::Failed(Error::store("put", path, e));
        }
        match self.inner.log.publish(&ship.org, &ship.entry).await {
            Ok(Published::Landed) => Landing::Landed,
            Ok(Published::Taken(theirs)) if theirs.is_stray_of(ship.round, ship.claim_seq) => {
                Landing::Stray
            }
            Ok(Published::Taken(theirs)) => Landing::Failed(Error::Fenced {
                org: ship.org.to_string(),
                ours: ship.round,
                theirs: theirs.round(),
            }),
            Err(e) => Landing::Failed(e),
        }
    }

    /// Records `landing`, the outcome of `ship`, in `claim` and returns what is acknowledged
    /// now: the newest landed entry of the longest prefix of the claim's slots resolved as
    /// ours or as strays (W2), `None` while the lowest unresolved slot is still in flight.
    /// A landed ship becomes the base of the next one issued when it is the newest landed.
    ///
    /// # Errors
    /// The landing's error, after which the claim is unusable: no ship at or above it, and
    /// none issued after it, is ever acknowledged (W3, I7).
    pub fn settle(
        &self,
        claim: &mut Claim,
        ship: InFlight,
        landing: Landing,
    ) -> Result<Option<Acked>, Error> {
        let seq = ship.seq();
        match landing {
            Landing::Landed => {
                debug!(org = %ship.org, round = ship.round, seq, commit = ship.commit(), "pipelined ship landed");
                claim.landed(
                    Tip {
                        seq,
                        hashes: ship.hashes,
                    },
                    ship.shipped.commit,
                );
            }
            Landing::Stray => {
                debug!(org = %ship.org, round = ship.round, seq, "pipelined ship's slot held by a stray");
                claim.stray_at(seq);
            }
            Landing::Failed(e) => {
                warn!(org = %ship.org, round = ship.round, seq, error = %e, "pipelined ship failed; the claim ends");
                claim.end(if matches!(e, Error::Fenced { .. }) {
                    "fenced"
                } else {
                    "a pipelined ship failed"
                });
                return Err(e);
            }
        }
        Ok(claim.acknowledge())
    }
}
