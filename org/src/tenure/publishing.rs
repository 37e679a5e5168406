//! The shipper lock: the one way to the org's claim and chain. Whoever holds a
//! [`Publishing`] guard is the one publishing for the org — shipping, confirming, parking,
//! unparking, releasing, or ending the tenure ([`super::end`]) — so none of these ever races
//! another (I6, I7, I13).

use std::ops::{Deref, DerefMut};

use idem_replica::Shipper;

/// The org's claim and chain behind their lock ([`ShipperLock::lock`] is the only way in).
pub(crate) struct ShipperLock(tokio::sync::Mutex<Shipper>);

/// Proof that the caller holds the shipper lock, and the shipper it guards. Ending a tenure
/// takes one ([`super::end`]): an org ends only while nothing else publishes for it.
pub(crate) struct Publishing<'a>(tokio::sync::MutexGuard<'a, Shipper>);

impl ShipperLock {
    pub(crate) fn new(shipper: Shipper) -> ShipperLock {
        ShipperLock(tokio::sync::Mutex::new(shipper))
    }

    /// Waits for a ship, confirmation, park or release in progress to end, then holds the
    /// lock until the guard drops.
    pub(crate) async fn lock(&self) -> Publishing<'_> {
        Publishing(self.0.lock().await)
    }
}

impl Deref for Publishing<'_> {
    type Target = Shipper;

    fn deref(&self) -> &Shipper {
        &self.0
    }
}

impl DerefMut for Publishing<'_> {
    fn deref_mut(&mut self) -> &mut Shipper {
        &mut self.0
    }
}
