//! Ship-before-ack with group commit (I6, I7).
//!
//! ```text
//! request:  commit (counter c) ──► wait(c) ─────────────────────────────► Ok (acknowledged)
//!                                     ▲
//! shipper:  demand? ─► snapshot (one read tx: pages + counter s) ─► ship ─► wake every c <= s
//! ```
//! Requests that commit while a ship is in flight are covered by the next one, so one ship
//! acknowledges many requests. `Fenced` fails every waiter and poisons the org; any other ship
//! error fails the waiters that ship would have covered with a retryable error.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use idem_replica::{Claim, OrgId, Replica, Snapshot};
use rusqlite::Connection;
use tokio::sync::{Notify, oneshot};

use crate::Error;
use crate::writer::read_commit;

type Waiter = (u64, oneshot::Sender<Result<(), Error>>);

/// Why an org stopped serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Fenced,
    Closed,
}

#[derive(Default)]
pub(crate) struct ShipState {
    pub shipped: u64,
    pub(crate) waiters: Vec<Waiter>,
    pub stop: Option<Stop>,
}

/// Counters of an org's shipping, for stats and benchmarks.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub ships: AtomicU64,
    pub ship_failures: AtomicU64,
    pub bytes_shipped: AtomicU64,
    pub acks: AtomicU64,
}

/// What the requests of one org share with its shipper.
pub(crate) struct Shared {
    pub org: OrgId,
    pub round: u64,
    pub committed: Arc<AtomicU64>,
    pub state: Mutex<ShipState>,
    pub demand: Notify,
    pub counters: Counters,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, ShipState> {
        // A panic while holding this lock cannot leave the state half-written: every critical
        // section only pushes, drains or assigns.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn stop_error(&self, stop: Stop) -> Error {
        match stop {
            Stop::Fenced => Error::Fenced {
                org: self.org.clone(),
                ours: self.round,
            },
            Stop::Closed => Error::Closed {
                org: self.org.clone(),
                round: self.round,
            },
        }
    }

    /// Waits until a ship covering commit `c` is published (I6).
    pub async fn wait_shipped(&self, c: u64) -> Result<(), Error> {
        let rx = {
            let mut st = self.lock();
            if c <= st.shipped {
                return Ok(());
            }
            if let Some(stop) = st.stop {
                return Err(self.stop_error(stop));
            }
            let (tx, rx) = oneshot::channel();
            st.waiters.push((c, tx));
            rx
        };
        self.demand.notify_one();
        let out = rx
            .await
            .unwrap_or_else(|_| Err(self.stop_error(Stop::Closed)));
        if out.is_ok() {
            self.counters.acks.fetch_add(1, Ordering::Relaxed);
        }
        out
    }

    /// True when some waiter needs a commit that is not shipped yet.
    pub fn has_demand(&self) -> bool {
        let st = self.lock();
        st.waiters.iter().any(|(c, _)| *c > st.shipped)
    }

    /// Fails every waiter and stops the org.
    pub fn stop(&self, stop: Stop) {
        let waiters = {
            let mut st = self.lock();
            st.stop.get_or_insert(stop);
            std::mem::take(&mut st.waiters)
        };
        for (_, tx) in waiters {
            let _ = tx.send(Err(self.stop_error(stop)));
        }
        self.demand.notify_one();
    }
}

/// Takes one snapshot and ships it, then settles the waiters it covers.
///
/// # Errors
/// The replica error; `Fenced`/unknown outcomes have already stopped the org when this returns.
pub(crate) async fn ship_once(
    shared: &Shared,
    replica: &Replica,
    claim: &mut Claim,
    reader: &Arc<Mutex<Option<Connection>>>,
) -> Result<(), Error> {
    let reader = reader.clone();
    let snap = tokio::task::spawn_blocking(move || {
        let conn = reader.lock().unwrap_or_else(|p| p.into_inner());
        conn.as_ref().map(|c| Snapshot::take(c, read_commit))
    })
    .await
    .map_err(|e| {
        Error::replica(
            shared.org.as_str(),
            idem_replica::Error::Task {
                op: "snapshot",
                source: e,
            },
        )
    })?
    .ok_or_else(|| shared.stop_error(Stop::Closed))?
    .map_err(|e| Error::replica(shared.org.as_str(), e))?;
    let s = snap.commit();
    match replica.ship(claim, snap).await {
        Ok(shipped) => {
            shared.counters.ships.fetch_add(1, Ordering::Relaxed);
            shared
                .counters
                .bytes_shipped
                .fetch_add(shipped.compressed_bytes, Ordering::Relaxed);
            let done = {
                let mut st = shared.lock();
                st.shipped = st.shipped.max(s);
                let (done, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut st.waiters)
                    .into_iter()
                    .partition(|(c, _)| *c <= s);
                st.waiters = wait;
                done
            };
            tracing::debug!(org = %shared.org, round = shared.round, seq = shipped.seq, commit = s, acks = done.len(), bytes = shipped.compressed_bytes, "shipped");
            for (_, tx) in done {
                let _ = tx.send(Ok(()));
            }
            Ok(())
        }
        Err(e) if e.is_fenced() => {
            tracing::warn!(org = %shared.org, round = shared.round, error = %e, "fenced");
            shared.stop(Stop::Fenced);
            Err(Error::Fenced {
                org: shared.org.clone(),
                ours: shared.round,
            })
        }
        Err(e) => {
            shared
                .counters
                .ship_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(org = %shared.org, round = shared.round, error = %e, "ship failed");
            let source = Arc::new(e);
            let failed = {
                let mut st = shared.lock();
                let (failed, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut st.waiters)
                    .into_iter()
                    .partition(|(c, _)| *c <= s);
                st.waiters = wait;
                failed
            };
            for (_, tx) in failed {
                let _ = tx.send(Err(Error::ShipFailed {
                    org: shared.org.clone(),
                    source: source.clone(),
                }));
            }
            Err(Error::ShipFailed {
                org: shared.org.clone(),
                source,
            })
        }
    }
}
