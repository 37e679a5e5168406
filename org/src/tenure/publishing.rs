//! The shipper lock: the one way to the org's claim and chain. Whoever holds a
//! [`Publishing`] guard is the one publishing for the org — shipping, confirming, parking,
//! unparking, releasing, or ending the tenure ([`super::end`]) — so none of these ever races
//! another (I6, I7, I13).
//!
//! What it guards is a [`Publisher`]: the per-org [`Shipper`] of a claim (3, 3e), or the
//! [`JournalShipper`] of a tenure in the process's journal run (3g). A journal org parks as
//! a per-org one does, but never keeps its file at release and never pipelines its own
//! ships: the run pipelines for every org at once.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use idem_replica::journal::JournalShipper;
use idem_replica::{CaptureSource, Error, ResumePoint, ShipReport, Shipper};

/// What publishes an org's commits.
#[derive(Debug)]
pub(crate) enum Publisher {
    /// Its own log: claim, ships, Release (3, 3e).
    PerOrg(Box<Shipper>),
    /// Sections in the process's journal run (3g).
    Journal(Box<JournalShipper>),
}

impl Publisher {
    /// Ships everything committed so far (a delta or snapshot, or a journal section).
    ///
    /// # Errors
    /// As [`Shipper::ship`] and [`JournalShipper::ship`].
    pub(crate) async fn ship(&mut self, source: &dyn CaptureSource) -> Result<ShipReport, Error> {
        match self {
            Publisher::PerOrg(s) => s.ship(source).await,
            Publisher::Journal(j) => j.ship(source).await,
        }
    }

    /// Confirms that no successor fenced this tenure and the files are unchanged (I6, I7).
    ///
    /// # Errors
    /// As [`Shipper::confirm`] and [`JournalShipper::confirm`].
    pub(crate) async fn confirm(&mut self) -> Result<(), Error> {
        match self {
            Publisher::PerOrg(s) => s.confirm().await,
            Publisher::Journal(j) => j.confirm().await,
        }
    }

    /// Releases the tenure so a successor takes it at once: the Release entry, or J4's
    /// released section, checkpoint and Release entry (which capture from `source`).
    ///
    /// # Errors
    /// As [`Shipper::release`] and [`JournalShipper::release`].
    pub(crate) async fn release(&mut self, source: &dyn CaptureSource) -> Result<(), Error> {
        match self {
            Publisher::PerOrg(s) => s.release().await,
            Publisher::Journal(j) => j.release(source).await,
        }
    }

    /// True when the writer may park once every commit is shipped: nothing captured waits
    /// to be published and the file is known to hold nothing else ([`Shipper::parkable`],
    /// [`JournalShipper::parkable`]).
    pub(crate) fn parkable(&self) -> bool {
        match self {
            Publisher::PerOrg(s) => s.parkable(),
            Publisher::Journal(j) => j.parkable(),
        }
    }

    /// Lets go of the writer's descriptors; call only once its connection is closed (I13).
    pub(crate) fn park(&mut self) {
        match self {
            Publisher::PerOrg(s) => s.park(),
            Publisher::Journal(j) => j.park(),
        }
    }

    /// True when [`Publisher::release`] captures from the writer (J4 for one org), so a
    /// parked writer must reopen first; false for a per-org release (nothing unshipped is
    /// captured there) and for a journal org once its run is closing (the release seal frees
    /// it).
    pub(crate) fn release_captures(&self) -> bool {
        matches!(self, Publisher::Journal(j) if j.release_captures())
    }

    /// The per-org shipper, for what only a claim has (pipelining, resuming).
    pub(crate) fn per_org(&mut self) -> Option<&mut Shipper> {
        match self {
            Publisher::PerOrg(s) => Some(s),
            Publisher::Journal(_) => None,
        }
    }

    /// Sections in the process's journal run (3g): no level file is written for the org.
    pub(crate) fn is_journal(&self) -> bool {
        matches!(self, Publisher::Journal(_))
    }

    /// Several ships in flight (3e): only a per-org claim with a window above 1.
    pub(crate) fn pipelined(&self) -> bool {
        matches!(self, Publisher::PerOrg(s) if s.pipelined())
    }

    /// The released position the kept file holds (per org only: a journal org's file is
    /// not kept).
    pub(crate) fn resume_point(&self) -> Option<ResumePoint> {
        match self {
            Publisher::PerOrg(s) => s.resume_point(),
            Publisher::Journal(_) => None,
        }
    }

    /// Whether the continued chain's file differs from its tip (per org only).
    ///
    /// # Errors
    /// As [`Shipper::inherited_unshipped`].
    pub(crate) async fn inherited_unshipped(&mut self) -> Result<bool, Error> {
        match self {
            Publisher::PerOrg(s) => s.inherited_unshipped().await,
            Publisher::Journal(_) => Ok(false),
        }
    }

    /// The next ship is a full snapshot (per org only).
    pub(crate) fn full_next(&mut self) {
        if let Publisher::PerOrg(s) = self {
            s.full_next();
        }
    }

    /// Takes back the writer's descriptors after an unpark, once the file is proven to be
    /// the published state.
    ///
    /// # Errors
    /// As [`Shipper::unpark`] and [`JournalShipper::unpark`].
    pub(crate) async fn unpark(
        &mut self,
        files: Arc<idem_replica::sqlite::OwnedFiles>,
    ) -> Result<(), Error> {
        match self {
            Publisher::PerOrg(s) => s.unpark(files).await,
            Publisher::Journal(j) => j.unpark(files).await,
        }
    }
}

/// The org's claim and chain behind their lock ([`ShipperLock::lock`] is the only way in).
pub(crate) struct ShipperLock(tokio::sync::Mutex<Publisher>);

/// Proof that the caller holds the shipper lock, and the publisher it guards. Ending a
/// tenure takes one ([`super::end`]): an org ends only while nothing else publishes for it.
pub(crate) struct Publishing<'a>(tokio::sync::MutexGuard<'a, Publisher>);

impl ShipperLock {
    pub(crate) fn new(publisher: Publisher) -> ShipperLock {
        ShipperLock(tokio::sync::Mutex::new(publisher))
    }

    /// Waits for a ship, confirmation, park or release in progress to end, then holds the
    /// lock until the guard drops.
    pub(crate) async fn lock(&self) -> Publishing<'_> {
        Publishing(self.0.lock().await)
    }
}

impl Deref for Publishing<'_> {
    type Target = Publisher;

    fn deref(&self) -> &Publisher {
        &self.0
    }
}

impl DerefMut for Publishing<'_> {
    fn deref_mut(&mut self) -> &mut Publisher {
        &mut self.0
    }
}
