//! The waiters: ship-before-ack with group commit (I6, I7).
//!
//! ```text
//! request:  commit (sequence c) ──► wait(c) ─────────────────────────────► Ok (acknowledged)
//!                                     ▲
//! shipper:  demand? ─► capture (writer thread: WAL frames + sequence s) ─► ship ─► wake every c <= s
//! ```
//! Requests that commit while a ship is in flight are covered by the next one, so one ship
//! acknowledges many requests. `Fenced` fails every waiter and poisons the org; any other ship
//! error fails the waiters that ship would have covered with a retryable error.
//!
//! A replay or a read commits nothing, but it is still an acknowledgement under this round
//! (I6, I7): it waits for a *confirmation* — a ship, or when nothing is unshipped a check that
//! no successor appended to the log — that started after the request arrived. A fenced
//! writer therefore never answers from its local file, even before it tries to ship.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use idem_replica::OrgId;
use tokio::sync::{Notify, oneshot};

use crate::Error;
use crate::commit::CommitSeq;

/// A waiting request: the commit it needs shipped, the first confirmation (by start number)
/// that may acknowledge it, and where to send the outcome.
pub(crate) struct Waiter {
    commit: u64,
    min_start: u64,
    pub(crate) tx: oneshot::Sender<Result<(), Error>>,
}

/// Why an org stopped serving.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Fenced,
    /// The claim can no longer publish for another reason than a successor's claim (a
    /// publish of unknown outcome, an unusable claim); the replica's error as text.
    ClaimLost(Arc<str>),
    Closed,
    /// Closed by a release that succeeded (`crate::tenure::end`: its Release entry landed,
    /// or, for a journal org whose run is closing, the run's release seal frees it): a later
    /// release of the same handle has nothing left to do and answers Ok. Requests get
    /// [`Error::Closed`] as after any close.
    Released,
    /// Someone else changed the org's files (I13); the reason as seen.
    Poisoned(Arc<str>),
}

#[derive(Default)]
pub(crate) struct AckState {
    pub shipped: u64,
    /// Confirmations (ships or successor checks) started so far.
    pub(crate) starts: u64,
    /// Start number of the latest confirmation that succeeded.
    pub(crate) confirmed: u64,
    pub(crate) waiters: Vec<Waiter>,
    pub stop: Option<Stop>,
}

impl AckState {
    fn satisfied(&self, w: &Waiter) -> bool {
        w.commit <= self.shipped && w.min_start <= self.confirmed
    }

    /// Begins a confirmation and returns its start number.
    pub(crate) fn begin(&mut self) -> u64 {
        self.starts += 1;
        self.starts
    }

    /// Records a successful confirmation and returns the waiters it acknowledges.
    fn succeed(&mut self, start: u64, shipped: u64) -> Vec<Waiter> {
        self.shipped = self.shipped.max(shipped);
        self.confirmed = self.confirmed.max(start);
        let (done, wait) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition(|w| self.satisfied(w));
        self.waiters = wait;
        done
    }

    /// Removes the waiters a failed confirmation would have acknowledged.
    pub(crate) fn fail(&mut self, start: u64, covering: u64) -> Vec<Waiter> {
        let (failed, wait) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition(|w: &Waiter| w.commit <= covering && w.min_start <= start);
        self.waiters = wait;
        failed
    }
}

/// Counters of an org's shipping, for stats and benchmarks.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub ships: AtomicU64,
    pub full_ships: AtomicU64,
    pub full_bytes: AtomicU64,
    pub compactions: AtomicU64,
    pub ship_failures: AtomicU64,
    pub bytes_shipped: AtomicU64,
    pub acks: AtomicU64,
    pub parks: AtomicU64,
    pub unparks: AtomicU64,
}

/// What the requests of one org share with its shipper.
pub(crate) struct Acks {
    pub org: OrgId,
    pub round: u64,
    pub commit_seq: Arc<CommitSeq>,
    pub state: Mutex<AckState>,
    pub demand: Notify,
    pub counters: Counters,
}

impl Acks {
    pub fn lock(&self) -> MutexGuard<'_, AckState> {
        crate::sync::lock(&self.state)
    }

    pub fn stop_error(&self, stop: Stop) -> Error {
        match stop {
            Stop::Poisoned(reason) => Error::Poisoned {
                org: self.org.clone(),
                round: self.round,
                reason: reason.to_string(),
            },
            Stop::Fenced => Error::Fenced {
                org: self.org.clone(),
                ours: self.round,
            },
            Stop::ClaimLost(reason) => Error::ClaimLost {
                org: self.org.clone(),
                round: self.round,
                reason: reason.to_string(),
            },
            Stop::Closed | Stop::Released => Error::Closed {
                org: self.org.clone(),
                round: self.round,
            },
        }
    }

    /// Waits until a ship covering commit `c` is published (I6): for a request that committed.
    pub async fn wait_shipped(&self, c: u64) -> Result<(), Error> {
        self.wait(c, false).await
    }

    /// Waits until commit `c` is shipped and a confirmation that started after this call
    /// succeeded (I6, I7): for replays and reads, which commit nothing themselves.
    pub async fn wait_confirmed(&self, c: u64) -> Result<(), Error> {
        self.wait(c, true).await
    }

    async fn wait(&self, c: u64, fresh: bool) -> Result<(), Error> {
        let rx = {
            let mut st = self.lock();
            if let Some(stop) = st.stop.clone() {
                return Err(self.stop_error(stop));
            }
            let waiter_min = if fresh { st.starts + 1 } else { 0 };
            if c <= st.shipped && waiter_min <= st.confirmed {
                return Ok(());
            }
            let (tx, rx) = oneshot::channel();
            st.waiters.push(Waiter {
                commit: c,
                min_start: waiter_min,
                tx,
            });
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

    /// True when some waiter needs a ship or a confirmation.
    pub fn has_demand(&self) -> bool {
        let st = self.lock();
        st.waiters.iter().any(|w| !st.satisfied(w))
    }

    /// True when some waiter needs a commit that is not shipped yet (a full ship, not only a
    /// successor check).
    pub fn needs_ship(&self) -> bool {
        let st = self.lock();
        st.waiters.iter().any(|w| w.commit > st.shipped)
    }

    /// True when some waiter needs a commit above both what is shipped and `issued` (what
    /// the ships in flight hold, `crate::pipeline`).
    pub fn needs_ship_after(&self, issued: u64) -> bool {
        let st = self.lock();
        let covered = st.shipped.max(issued);
        st.waiters.iter().any(|w| w.commit > covered)
    }

    /// Fails every waiter and stops the org (the first reason to stop it stays).
    pub fn stop(&self, stop: Stop) {
        let (stop, waiters) = {
            let mut st = self.lock();
            let stop = st.stop.get_or_insert(stop).clone();
            (stop, std::mem::take(&mut st.waiters))
        };
        for w in waiters {
            let _ = w.tx.send(Err(self.stop_error(stop.clone())));
        }
        self.demand.notify_one();
    }

    /// Stops the org because its files were changed by someone else (I13): every waiter
    /// fails, nothing more is published or acknowledged; one log line.
    pub(crate) fn poison(&self, reason: &str) -> Error {
        metrics::counter!(crate::metrics::WRITERS_STOPPED, "reason" => "poisoned").increment(1);
        tracing::error!(org = %self.org, round = self.round, reason, "org poisoned: its local files were changed outside the writer; nothing more is acknowledged, it re-opens from the store");
        self.stop(Stop::Poisoned(reason.into()));
        let stop = self.lock().stop.clone().unwrap_or(Stop::Closed);
        self.stop_error(stop)
    }
}

impl Acks {
    /// Stops the org because its claim can no longer publish (I7): fenced by a successor,
    /// or lost another way (a publish of unknown outcome); every waiter fails with it.
    pub(crate) fn lose_claim(&self, e: &idem_replica::Error) -> Error {
        let (stop, reason) = match e {
            idem_replica::Error::Fenced { .. } => (Stop::Fenced, "fenced"),
            e => (Stop::ClaimLost(e.to_string().into()), "claim_lost"),
        };
        tracing::warn!(org = %self.org, round = self.round, error = %e, "{reason}");
        metrics::counter!(crate::metrics::WRITERS_STOPPED, "reason" => reason).increment(1);
        self.stop(stop);
        let stop = self.lock().stop.clone().unwrap_or(Stop::Closed);
        self.stop_error(stop)
    }

    /// Settles a successful confirmation that started as `start` and covers commit
    /// `shipped`: wakes every waiter it acknowledges.
    pub(crate) fn confirmed(&self, start: u64, shipped: u64) -> usize {
        let done = self.lock().succeed(start, shipped);
        let n = done.len();
        for w in done {
            let _ = w.tx.send(Ok(()));
        }
        n
    }

    /// Settles a failed confirmation: changed files poison the org; fenced (or an unknown
    /// outcome) stops it; anything else fails the waiters it would have acknowledged with a
    /// retryable error.
    pub(crate) fn failed(&self, start: u64, covering: u64, e: idem_replica::Error) -> Error {
        match e {
            idem_replica::Error::FilesChanged { reason, .. } => self.poison(&reason),
            e if e.is_claim_lost() => self.lose_claim(&e),
            e => {
                self.counters.ship_failures.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(crate::metrics::SHIP_FAILURES).increment(1);
                tracing::warn!(org = %self.org, round = self.round, error = %e, "ship failed");
                let source = Arc::new(e);
                let failed = self.lock().fail(start, covering);
                for w in failed {
                    let _ = w.tx.send(Err(Error::ShipFailed {
                        org: self.org.clone(),
                        source: source.clone(),
                    }));
                }
                Error::ShipFailed {
                    org: self.org.clone(),
                    source,
                }
            }
        }
    }
}
