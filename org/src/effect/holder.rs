//! One org handle as the holder of effect reservations: the label its reservations carry,
//! the effect protocols running in it (one per key at a time), and the rule by which it
//! judges when a reservation's lease lapses — on its own clock only (I15).
//!
//! ```text
//! a RESERVED row whose holder is …        lapses for this writer at …
//!   this handle, its protocol running     never while it runs (the executor's answer is
//!                                         awaited: a retry here waits for it)
//!   this handle, its protocol ended       at once (this writer knows its executor ended
//!                                         without a settlement that landed)
//!   anyone else (an earlier round, maybe  one lease term (lease_until − created, a duration
//!   another host)                         of one clock) after this writer's claim, on this
//!                                         writer's clock: never before the holder's own
//!                                         deadline, since the row was published before
//!                                         the claim
//! ```
//! No decision compares a timestamp another host wrote with this host's clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use idem::effect::{self, Effect, State};
use tokio::sync::{OwnedMutexGuard, watch};

use crate::sync::lock;

/// The effect side of one org handle (shared by its clones and its writer's jobs).
pub(crate) struct Holder {
    /// What this handle's reservations name as holder: writer id, process instance and
    /// round, unique per handle (a round is claimed once).
    pub(crate) label: String,
    /// When this handle's claim was made, in ms of `clock`.
    claim_ms: u64,
    clock: Arc<dyn idem::Clock>,
    /// Per key, the lock its running protocol holds: one protocol per key at a time.
    keys: Mutex<HashMap<String, Slot>>,
    /// Protocols holding a key (a release waits for them).
    running: watch::Sender<usize>,
    /// The RESERVED and AMBIGUOUS rows after the last effect write (`super::gauge`).
    pub(crate) open: Mutex<Vec<Effect>>,
}

#[derive(Clone, Default)]
struct Slot {
    lock: Arc<tokio::sync::Mutex<()>>,
    /// The attempt id of the protocol holding the key, set before it reserves: a row of this
    /// handle with another attempt is one whose protocol ended.
    attempt: Arc<Mutex<Option<Vec<u8>>>>,
    /// The running reservation's lease (own clock), 0 until it is reserved.
    lease_until_ms: Arc<AtomicU64>,
}

/// A key held by one running protocol; dropping it lets the next protocol for the key run.
pub(crate) struct KeyGuard {
    holder: Arc<Holder>,
    key: String,
    slot: Slot,
    guard: Option<OwnedMutexGuard<()>>,
}

impl KeyGuard {
    /// Names the attempt this protocol reserves with, before it reserves.
    pub(crate) fn attempt(&self, attempt: &[u8]) {
        *lock(&self.slot.attempt) = Some(attempt.to_vec());
    }

    /// Records the reservation's lease (own clock) for a release that waits.
    pub(crate) fn reserved_until(&self, ms: u64) {
        self.slot.lease_until_ms.store(ms, Ordering::SeqCst);
    }
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        *lock(&self.slot.attempt) = None;
        self.guard.take();
        let mut keys = lock(&self.holder.keys);
        // Only the map holds the slot now: nobody runs or waits for this key.
        if keys
            .get(&self.key)
            .is_some_and(|s| Arc::strong_count(&s.lock) == 1)
        {
            keys.remove(&self.key);
        }
        drop(keys);
        self.holder
            .running
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Holder {
    pub(crate) fn new(
        writer: &str,
        instance: &str,
        round: u64,
        clock: Arc<dyn idem::Clock>,
    ) -> Holder {
        Holder {
            label: format!("{writer} (instance {instance}, round {round})"),
            claim_ms: clock.now_ms(),
            clock,
            keys: Mutex::new(HashMap::new()),
            running: watch::channel(0).0,
            open: Mutex::new(Vec::new()),
        }
    }

    /// Takes `key` for one protocol, waiting for a protocol of the same key running here to
    /// end first (its retry then finds the key settled and replays it, instead of "in
    /// progress"). Cancel-safe: a waiter dropped before it gets the key takes nothing.
    pub(crate) async fn enter(self: &Arc<Self>, key: &str) -> KeyGuard {
        let slot = lock(&self.keys).entry(key.to_owned()).or_default().clone();
        let guard = slot.lock.clone().lock_owned().await;
        self.running.send_modify(|n| *n += 1);
        KeyGuard {
            holder: self.clone(),
            key: key.to_owned(),
            slot,
            guard: Some(guard),
        }
    }

    /// True while a protocol of this handle holds `key` for `attempt`.
    fn is_running(&self, key: &str, attempt: &[u8]) -> bool {
        let slot = lock(&self.keys).get(key).cloned();
        slot.is_some_and(|s| lock(&s.attempt).as_deref() == Some(attempt))
    }

    /// When `row`'s lease lapses for this writer, in ms of its clock (the module's table).
    pub(crate) fn lapses_at(&self, row: &Effect) -> u64 {
        if row.holder.as_deref() == Some(self.label.as_str()) {
            if self.is_running(&row.key, &row.attempt) {
                // Its executor's answer is awaited; "until" reads as the stamp or now.
                row.lease_until_ms
                    .max(self.clock.now_ms().saturating_add(1))
            } else {
                0
            }
        } else {
            let term = row.lease_until_ms.saturating_sub(row.created_ms);
            self.claim_ms.saturating_add(term)
        }
    }

    /// `opts` as every effect call of this handle runs it: this handle named as holder, its
    /// lapse rule, and the registry clock unless a test set one. The writer adds the
    /// commit-counter bump when it runs the call (`writer::run`, I6).
    pub(crate) fn options(self: &Arc<Self>, opts: effect::Options) -> effect::Options {
        let rule = Arc::downgrade(self);
        let opts = opts
            .holder(self.label.clone())
            .lapse(Arc::new(move |row: &Effect| match rule.upgrade() {
                Some(holder) => holder.lapses_at(row),
                None => row.lease_until_ms,
            }));
        if opts.has_clock() {
            opts
        } else {
            opts.clock(self.clock.clone())
        }
    }

    /// Waits until no effect protocol of this handle runs, or until the leases of those still
    /// running have lapsed on this writer's clock (a hung executor does not hold a release
    /// forever). Returns how many were still running.
    pub(crate) async fn wait_idle(&self) -> usize {
        let mut running = self.running.subscribe();
        loop {
            if *running.borrow_and_update() == 0 {
                return 0;
            }
            let latest = lock(&self.keys)
                .values()
                .map(|s| s.lease_until_ms.load(Ordering::SeqCst))
                .max()
                .unwrap_or(0);
            let now = self.clock.now_ms();
            // 0: reserving still; wait a lease term at most.
            let until = if latest == 0 {
                now.saturating_add(effect::DEFAULT_LEASE_MS)
            } else {
                latest
            };
            if now >= until {
                return *running.borrow();
            }
            let wait = std::time::Duration::from_millis(until - now);
            match tokio::time::timeout(wait, running.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return *running.borrow(),
            }
        }
    }

    /// The open rows as this writer judges them now: (in progress, needing a resolution).
    pub(crate) fn open_counts(&self) -> (u64, u64) {
        let now = self.clock.now_ms();
        let open = lock(&self.open);
        let ambiguous = open
            .iter()
            .filter(|r| {
                r.state == State::Ambiguous
                    || (r.state == State::Reserved && now >= self.lapses_at(r))
            })
            .count() as u64;
        (open.len() as u64 - ambiguous, ambiguous)
    }
}
