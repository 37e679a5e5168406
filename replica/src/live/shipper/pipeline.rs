//! The shipper's pipelined ships (`docs/design.md` 3e): a capture per ship, issued while
//! earlier ones are in flight, each carrying every page changed since the newest landed one
//! (W1), settled in any order and acknowledged in slot order (W2).
//!
//! ```text
//! issue:  capture -> frames into this ship's increment -> delta of every increment above
//!         the newest landed ship -> Replica::issue_delta
//! settle: Replica::settle -> a landed ship that is the newest drops the increments at or
//!         below it (their pages are in the store's newest position)
//! ```
//!
//! Compactions are not pipelined, and a full snapshot waits until nothing is in flight (W4):
//! [`Shipper::issue`] says when one is due instead of issuing a delta.

use std::collections::BTreeMap;

use super::{CaptureSource, Shipper, WalState, proved_frames};
use crate::live::{CaptureRequest, Checkpoint};
use crate::{Acked, Delta, Error, InFlight, Landing};

/// What [`Shipper::issue`] did.
#[derive(Debug)]
pub enum Issued {
    /// A delta is in flight: land it with [`crate::Replica::land`], then settle it.
    Ship(Box<InFlight>),
    /// The chain must restart from a full snapshot (the policy, a lost WAL position, a
    /// refused delta): let every ship in flight settle, then [`Shipper::ship`].
    Full,
}

impl Shipper {
    /// True when this shipper's claim keeps several ships in flight.
    pub fn pipelined(&self) -> bool {
        self.claim.ship_window() > 1
    }

    /// How many ships may still be issued before one settles: slots below the lowest
    /// unresolved one plus the window (1 while the claim is in doubt, W3), less the next.
    pub fn room(&self) -> usize {
        self.claim.room()
    }

    /// Captures everything committed since the last capture and issues it as the next
    /// pipelined ship, or says a full snapshot is due. Holds the commit sequence the capture
    /// proved (I13); the caller acknowledges nothing until [`Shipper::settle`] says so.
    ///
    /// # Errors
    /// [`Error::FilesChanged`] (the claim must end); a capture's or the claim's error (nothing
    /// was issued; the captured pages stay pending for the next ship).
    pub async fn issue(&mut self, source: &dyn CaptureSource) -> Result<Issued, Error> {
        let now = self.replica.inner.clock.monotonic_ms();
        if self.full_requested || self.chain.wants_full(&self.claim, &self.policy, now) {
            return Ok(Issued::Full);
        }
        if self.chain.diff_file && !self.take_file_changes().await? {
            return Ok(Issued::Full);
        }
        let from = match self.chain.wal {
            WalState::At(pos) => Some(pos),
            WalState::Fresh => None,
            WalState::Lost => return Ok(Issued::Full),
        };
        let request = CaptureRequest {
            from: from.map_or(0, |p| p.offset),
            checkpoint: Checkpoint::AfterIfOver(self.policy.wal_checkpoint_bytes),
        };
        let cap = match source.capture(request).await {
            Ok(cap) => cap,
            Err(e) => {
                self.chain.wal = WalState::Lost;
                return Err(self.capture_error(e));
            }
        };
        let (commit, reset) = (cap.commit, cap.reset);
        let previous = self.chain.proven;
        let frames = proved_frames(cap.head, cap.tail, cap.counter_page, commit, from, previous)
            .await?
            .map_err(|f| self.files_changed(&f))?;
        self.chain.proven = Some(commit);
        if let Some(pos) = frames.end
            && pos.page_size != self.chain.page_size
        {
            return Ok(Issued::Full);
        }
        let db_pages = self.chain.take_frames(frames, reset);
        // This capture's pages, and every increment above the newest landed ship: the
        // delta holds every page changed since the position it is based on (W1).
        let increment = std::mem::take(&mut self.chain.pending);
        let mut pages: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        for older in self.increments.values() {
            pages.extend(older.iter().map(|(p, b)| (*p, b.clone())));
        }
        pages.extend(increment.iter().map(|(p, b)| (*p, b.clone())));
        pages.retain(|p, _| *p <= db_pages);
        let delta = Delta::new(self.chain.page_size, db_pages, pages, commit);
        let issued = match delta {
            Ok(delta) => self.replica.issue_delta(&mut self.claim, delta).await,
            Err(e) => Err(e),
        };
        match issued {
            Ok(ship) => {
                self.increments.insert(ship.seq(), increment);
                Ok(Issued::Ship(Box::new(ship)))
            }
            Err(Error::NoChainTip { .. } | Error::DeltaRefused { .. }) => {
                self.chain.pending = increment;
                Ok(Issued::Full)
            }
            Err(e) => {
                self.chain.pending = increment;
                Err(e)
            }
        }
    }

    /// Records the outcome of an issued ship and returns what is acknowledged now (W2): every
    /// commit up to [`Acked::commit`]. A landed ship that is the newest landed becomes the
    /// base of the next one, and the pages it holds leave the pending increments.
    ///
    /// # Errors
    /// The landing's error: the claim ends (W3), and nothing at or after that ship is ever
    /// acknowledged.
    pub fn settle(&mut self, ship: InFlight, landing: Landing) -> Result<Option<Acked>, Error> {
        let (seq, bytes) = (ship.seq(), ship.shipped().compressed_bytes);
        let landed = matches!(landing, Landing::Landed);
        let acked = self.replica.settle(&mut self.claim, ship, landing)?;
        if landed && self.claim.tip().is_some_and(|t| t.seq == seq) {
            let mut done = BTreeMap::new();
            let below: Vec<u64> = self.increments.range(..=seq).map(|(s, _)| *s).collect();
            for s in below {
                if let Some(pages) = self.increments.remove(&s) {
                    done.extend(pages);
                }
            }
            // The landed pages are the tip's now: counted for the policy, cached for
            // nothing (pipelined deltas carry whole pages).
            let pending = std::mem::replace(&mut self.chain.pending, done);
            self.chain.delta_shipped(false, bytes, 0);
            self.chain.pending = pending;
        }
        Ok(acked)
    }
}
