//! The store's clock (I15): how far this host's clock reads from the store's, measured from
//! the Last-Modified the store gives an object this process wrote — never from a time another
//! host wrote. Decisions that delete by wall-clock age (key prune, snapshot retention) ask
//! [`crate::Replica::store_time`] first; past [`crate::Settings::max_clock_skew_ms`] prune is
//! refused and retention skips its deletions by age.
//!
//! A reading is the object's Last-Modified (the store's time of the write, truncated to whole
//! seconds by S3: never later than it) plus the time elapsed since the answer arrived on this
//! process's monotonic clock: a lower bound of the store's time now, which a step of this
//! host's wall clock cannot move. Which object (I16):
//!
//! ```text
//! a reading younger than REMEASURE_AFTER   no request
//! this process's lease (it renews it       HEAD processes/<instance>.json      1 request
//!   every lease_ms / 3 anyway)
//! none, or the lease disagrees             PUT + HEAD + DELETE probe/<nonce>    3 requests
//! ```
//!
//! A refusal is decided only by a probe written for it (or one younger than
//! `REMEASURE_AFTER`): a lease renewal that stalled reads old, and must not refuse by itself.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use tracing::{debug, info};

use crate::fence::lease::Leases;
use crate::format::layout::new_nonce;
use crate::metrics::{CLOCK_REFUSALS, CLOCK_SKEW_SECONDS};
use crate::store::Store;
use crate::{Clock, Error, Settings};

/// How long one measurement answers for, on this process's monotonic clock. It bounds the
/// store requests a busy process spends on the check (at most one measurement a minute)
/// and how long a drift between the monotonic clock and the store's can accumulate.
pub const REMEASURE_AFTER: Duration = Duration::from_secs(60);

/// One reading of the store's clock beside this host's, both in ms since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreTime {
    /// This host's clock (the replica's injected [`crate::Clock`]) when the reading was made.
    pub host_ms: u64,
    /// The store's time then, as a lower bound: the Last-Modified of an object this process
    /// wrote plus the monotonic time elapsed since the store answered.
    pub store_ms: u64,
}

impl StoreTime {
    /// `host_ms - store_ms`: positive when this host's clock reads ahead of the store's.
    pub fn skew_ms(&self) -> i64 {
        signed(self.host_ms) - signed(self.store_ms)
    }

    /// The now that a deletion by age uses: the earlier of the two clocks, so nothing is
    /// judged older than it is by either (ms since the Unix epoch).
    pub fn now_ms(&self) -> u64 {
        self.host_ms.min(self.store_ms)
    }

    /// How far the host reads ahead of the store, in ms (0 when it reads behind): what a
    /// cutoff computed from the host's clock must move back by.
    pub fn ahead_ms(&self) -> u64 {
        self.host_ms.saturating_sub(self.store_ms)
    }

    fn within(&self, bound_ms: u64) -> bool {
        self.skew_ms().unsigned_abs() <= bound_ms
    }
}

fn signed(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// The store's clock as this handle measures it: the probe objects it writes, the HEAD of
/// this process's lease, and the last measurement (one per [`crate::Replica`] handle and
/// its clones).
#[derive(Debug)]
pub(crate) struct StoreClock {
    store: Store,
    clock: Arc<dyn Clock>,
    /// Whether this process's lease is written and renewed, and its instance.
    leases: Arc<Leases>,
    /// [`crate::Settings::max_clock_skew_ms`].
    max_skew_ms: u64,
    last: Mutex<Option<Reading>>,
}

#[derive(Debug, Clone, Copy)]
struct Reading {
    /// The object's Last-Modified, ms since the Unix epoch.
    modified_ms: u64,
    /// The injected clock's monotonic time ([`crate::Clock::monotonic_ms`]) when the store's
    /// answer arrived.
    at_ms: u64,
    /// Read from a probe written for the measurement (not the lease, which may read old).
    probed: bool,
}

impl Reading {
    /// The store's time now, `monotonic_ms` being the injected clock's monotonic time now.
    fn store_now_ms(&self, monotonic_ms: u64) -> u64 {
        let elapsed = monotonic_ms.saturating_sub(self.at_ms);
        self.modified_ms.saturating_add(elapsed)
    }
}

impl StoreClock {
    /// The store's clock over `store`, read with `clock`, judged by `settings`' bound.
    pub(crate) fn new(
        store: Store,
        clock: Arc<dyn Clock>,
        leases: Arc<Leases>,
        settings: &Settings,
    ) -> StoreClock {
        StoreClock {
            store,
            clock,
            leases,
            max_skew_ms: settings.max_clock_skew_ms,
            last: Mutex::new(None),
        }
    }

    /// The last reading, if younger than [`REMEASURE_AFTER`] at `monotonic_ms`.
    fn fresh(&self, monotonic_ms: u64) -> Option<Reading> {
        let last = *idem_base::lock(&self.last);
        let max_age = u64::try_from(REMEASURE_AFTER.as_millis()).unwrap_or(u64::MAX);
        last.filter(|r| monotonic_ms.saturating_sub(r.at_ms) < max_age)
    }

    fn keep(&self, reading: Reading) {
        *idem_base::lock(&self.last) = Some(reading);
    }

    /// This host's clock beside the store's, checked, for the decision `op` names
    /// ([`crate::Replica::store_time`]).
    ///
    /// # Errors
    /// As [`crate::Replica::store_time`].
    pub(crate) async fn store_time(&self, op: &'static str) -> Result<StoreTime, Error> {
        let bound = self.max_skew_ms;
        let cached = self.fresh(self.clock.monotonic_ms());
        if let Some(r) = cached {
            let t = self.beside_host(&r);
            if t.within(bound) {
                return Ok(t);
            }
            if r.probed {
                return Err(self.refuse(op, t, false));
            }
        }
        // A lease reading that disagreed is not read again: its renewal may have stalled.
        let try_lease = cached.is_none() && self.leases.started();
        if try_lease && let Some(r) = self.read_lease_time().await? {
            let t = self.beside_host(&r);
            if t.within(bound) {
                self.keep(r);
                return Ok(t);
            }
        }
        let r = self.read_probe_time().await?;
        self.keep(r);
        let t = self.beside_host(&r);
        if t.within(bound) {
            Ok(t)
        } else {
            Err(self.refuse(op, t, true))
        }
    }

    /// `reading` beside this host's clock now.
    fn beside_host(&self, reading: &Reading) -> StoreTime {
        StoreTime {
            host_ms: self.clock.now_ms(),
            store_ms: reading.store_now_ms(self.clock.monotonic_ms()),
        }
    }

    /// Counts a refusal, and logs it with its measurement (once per measurement, not per
    /// decision it refuses).
    fn refuse(&self, op: &'static str, t: StoreTime, measured: bool) -> Error {
        metrics::counter!(CLOCK_REFUSALS, "op" => op).increment(1);
        let err = Error::ClockSkew {
            op,
            host_ms: t.host_ms,
            store_ms: t.store_ms,
            max_skew_ms: self.max_skew_ms,
        };
        // Info, not warn: the caller reports the error it returns (one line per run).
        if measured {
            info!(
                op,
                skew_ms = t.skew_ms(),
                host_ms = t.host_ms,
                store_ms = t.store_ms,
                "{err}"
            );
        }
        err
    }

    /// The Last-Modified of this process's lease; `None` when it is not in the store (its
    /// first write failed, and the renewal task retries).
    async fn read_lease_time(&self) -> Result<Option<Reading>, Error> {
        let path = self.store.layout.process(self.leases.instance());
        match self.head_time(&path, false).await {
            Ok(r) => Ok(Some(r)),
            Err(Error::Store {
                source: object_store::Error::NotFound { .. },
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes a probe object, reads its Last-Modified, deletes it.
    async fn read_probe_time(&self) -> Result<Reading, Error> {
        self.store.writable("clock check")?;
        let path = self.store.layout.probe(&new_nonce()?);
        let body = PutPayload::from(Bytes::from_static(b"idem clock probe"));
        self.store
            .object
            .put(&path, body)
            .await
            .map_err(|e| Error::store("put", &path, e))?;
        let read = self.head_time(&path, true).await;
        // A probe left behind (the delete failed) is a few bytes no reader looks at.
        if let Err(e) = self.store.object.delete(&path).await {
            debug!(%path, error = %e, "could not delete the clock probe");
        }
        read
    }

    async fn head_time(&self, path: &Path, probed: bool) -> Result<Reading, Error> {
        let meta = self
            .store
            .object
            .head(path)
            .await
            .map_err(|e| Error::store("head", path, e))?;
        let at_ms = self.clock.monotonic_ms();
        let modified_ms = u64::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0);
        let reading = Reading {
            modified_ms,
            at_ms,
            probed,
        };
        let skew = self.beside_host(&reading).skew_ms();
        #[allow(clippy::cast_precision_loss)]
        metrics::gauge!(CLOCK_SKEW_SECONDS).set(skew as f64 / 1000.0);
        Ok(reading)
    }
}

#[cfg(test)]
mod tests;
