//! An org's private state while this process serves it: its acknowledgements, its writer,
//! its claim and chain behind the shipper lock, its local files and its place among the
//! registry's active orgs.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idem_replica::Replica;

use super::publishing::{Publishing, ShipperLock};
use crate::RegistrySettings;
use crate::ack::Acks;
use crate::active::{Active, Member};
use crate::local::LocalFiles;
use crate::writer::Writer;

/// The registry's orgs that hold a connection.
pub(crate) type ActiveOrgs = Active<Inner>;

/// One served org: shared by its `Org` handles, its shipper task and its registry.
pub(crate) struct Inner {
    pub(crate) acks: Arc<Acks>,
    pub(crate) replica: Replica,
    pub(crate) settings: RegistrySettings,
    /// The claim and the chain: taken only through [`Inner::publishing`].
    pub(super) shipper: ShipperLock,
    pub(crate) writer: Arc<Writer>,
    /// The data directory's lock, held while any org of it serves (not only while its
    /// registry lives): it is what tells a restart that this process is gone.
    pub(crate) _home: Arc<crate::local::Home>,
    /// The local files; taken once, when the tenure ends (`super::end`).
    pub(super) files: Mutex<Option<LocalFiles>>,
    pub(crate) inflight: AtomicUsize,
    pub(crate) last_used: AtomicU64,
    /// Unique per handle: this org's key in `active`.
    pub(crate) serial: u64,
    /// The registry's orgs that hold a connection (`crate::park`).
    pub(crate) active: Arc<ActiveOrgs>,
    /// True once the tenure ended: the writer closed and the files kept or discarded.
    pub(crate) closed: tokio::sync::watch::Sender<bool>,
    /// This handle as the holder of effect reservations (`crate::effect`).
    pub(crate) effects: Arc<crate::effect::holder::Holder>,
}

/// The process-wide use counter that orders orgs by recent use (larger is later).
pub(crate) static TICK: AtomicU64 = AtomicU64::new(0);

/// Serial numbers of open org handles: the key of [`ActiveOrgs`] (one org id may have a
/// closing handle and a new one at once).
pub(crate) static SERIAL: AtomicU64 = AtomicU64::new(0);

impl Inner {
    /// Requests queued or running on the writer, or waiting for a ship or confirmation.
    pub(crate) fn busy(&self) -> usize {
        self.inflight.load(Ordering::SeqCst) + self.acks.lock().waiters.len()
    }

    /// Takes the shipper lock: the one way to ship, confirm, park, unpark, release or end
    /// this org (waits for whoever holds it).
    pub(crate) async fn publishing(&self) -> Publishing<'_> {
        self.shipper.lock().await
    }
}

impl Member for Inner {
    fn serial(&self) -> u64 {
        self.serial
    }

    fn busy(&self) -> usize {
        Inner::busy(self)
    }

    fn last_used(&self) -> u64 {
        self.last_used.load(Ordering::Relaxed)
    }
}

/// Decrements the in-flight count when a request ends, however it ends.
pub(crate) struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    /// Counts one request in flight on `inner` until dropped: an org with any is never
    /// evicted or parked.
    pub(crate) fn new(inner: &'a Inner) -> Self {
        inner.inflight.fetch_add(1, Ordering::SeqCst);
        InFlight(&inner.inflight)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
