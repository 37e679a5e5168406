//! One clock for the whole stack: the embedder's [`idem::Clock`], adapted to the snapshot
//! store's clock trait (idem and idem-replica never import each other, so org adapts).

use std::sync::Arc;

/// The embedder's clock seen through `idem_replica::Clock`: its wall time, and the host's
/// monotonic clock (`idem::Clock` has none) for judging leases by observation (I15).
#[derive(Debug)]
struct ReplicaClock(Arc<dyn idem::Clock>);

impl idem_replica::Clock for ReplicaClock {
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }

    fn monotonic_ms(&self) -> u64 {
        idem_replica::SystemClock.monotonic_ms()
    }
}

/// Adapts `clock` for [`idem_replica::Replica::open_with`], so the replica's log stamps and
/// retention ages read the same time, in ms since the Unix epoch, as the
/// [`crate::RegistryBuilder::clock`] that stamps keys and effects; how long a lease was seen
/// unchanged is measured on the host's monotonic clock, which no wall clock moves (I15).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use idem_org::{Registry, idem, replica};
///
/// let dir = tempfile::tempdir()?;
/// let clock: Arc<dyn idem::Clock> = Arc::new(idem::ManualClock::new(1_700_000_000_000));
/// let store = replica::Replica::local_store(&dir.path().join("store"))?;
/// let settings = replica::Settings::default();
/// let replica_clock = idem_org::replica_clock(clock.clone());
/// let replica = replica::Replica::open_with(store, "", settings, replica_clock, None).await?;
/// let registry = Registry::builder(dir.path().join("data"), replica, "a").clock(clock).build()?;
/// # let _ = registry;
/// # Ok(())
/// # }
/// ```
pub fn replica_clock(clock: Arc<dyn idem::Clock>) -> Arc<dyn idem_replica::Clock> {
    Arc::new(ReplicaClock(clock))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replica_reads_the_embedders_clock() {
        let clock = Arc::new(idem::ManualClock::new(5));
        let replica = replica_clock(clock.clone());
        clock.advance(10);
        assert_eq!(replica.now_ms(), 15);
        // A step of the embedder's wall clock never moves the time leases are judged by.
        let before = replica.monotonic_ms();
        clock.set(u64::MAX / 2);
        assert!(replica.monotonic_ms() - before < 60_000);
    }
}
