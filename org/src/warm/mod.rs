//! The warm takeover: claiming orgs in the background before their next requests arrive.
//!
//! Three sources name the orgs to claim. A draining process lists, in its process lease, the
//! orgs it is releasing ([`idem_replica::ProcessLease::releasing`]); the watcher
//! (`watcher.rs`) finds it by listing `processes/`. And a request this registry refused
//! with a held lease ([`idem_replica::Error::LeaseHeld`]) leaves the org remembered here,
//! with the wait the refusal named, so that when the holder turns out dead (its process
//! lease unchanged for a whole watch) the org is claimed with every other such org at once.
//! On the journal a third: a claim that took an org free at a recent release seal of
//! another process names that drained run, whose other orgs are then learned from its
//! roster and claimed (K2.6, [`Warm::follow_released`]): a drain is listed for two of its
//! process's own polls ([`Warm::drain_linger`]), which a slower watcher, or one started
//! after it, can still miss.
//!
//! Every claim is the normal one through [`crate::Registry`]: never forced, so it passes
//! only when the org's Release entry is at the head or its holder's process lease was seen
//! unchanged for a whole watch (I7, I15). A claim refused again is retried later, never
//! pushed through. Background claims are bounded in number ([`WarmSettings::concurrency`])
//! and stop at the registry's open-org and active-org limits and when it shuts down.

mod watcher;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use idem_replica::OrgId;
use tokio::sync::{Notify, Semaphore};

use crate::registry::{Registry, RegistryInner};
use crate::sync::lock;
use crate::{Error, WarmSettings};

pub(crate) use watcher::spawn;

/// Times an org refused with a held lease is claimed again in the background before it is
/// forgotten (a later request remembers it again): a holder that keeps renewing is alive,
/// and its orgs stay where they are.
const REFUSED_TRIES: u32 = 3;

/// How long, in multiples of the draining holder's term, the orgs it lists are retried
/// while their Release entries have not landed: past it the holder has either released
/// them or died, and a claim then waits for the normal watch like any other.
const DRAINING_TERMS: u64 = 3;

/// The longest a draining process keeps its lease listed for watchers ([`Warm::drain_linger`]),
/// ms: a shutdown must end well inside a SIGTERM's usual grace period (30 s), releases
/// included. Polls up to half of it are covered whatever their phase; a slower watcher sees
/// a short drain with a chance of this over its poll (and on the journal follows the run's
/// release seal at its first claim, K2.6).
pub(crate) const DRAIN_LINGER_MAX_MS: u64 = 5_000;

/// The warm takeover's state in a registry: see the module docs.
pub(crate) struct Warm {
    settings: WarmSettings,
    /// The watcher's period between LISTs, ms (`settings.poll_ms`, or the replica's renewal
    /// period for 0).
    poll_ms: u64,
    clock: Arc<dyn idem::Clock>,
    /// Orgs refused with a held lease, to claim again once the wait the refusal named has
    /// passed (at most `settings.remember`).
    refused: std::sync::Mutex<HashMap<OrgId, Refusal>>,
    /// Orgs with a background claim under way: each has one task at most.
    claiming: std::sync::Mutex<HashSet<OrgId>>,
    /// Background claims in flight (each attempt holds one permit).
    permits: Arc<Semaphore>,
    /// Wakes the watcher: a refusal was remembered, or the registry is shutting down.
    pub(crate) wake: Notify,
    /// Orgs opened by a background claim so far.
    claimed: AtomicU64,
    /// Set by a held-lease refusal: the holder may be draining, so the watcher lists
    /// `processes/` at its next wake instead of at its next poll (at most once per
    /// `settings.retry_ms`).
    pub(crate) look_now: std::sync::atomic::AtomicBool,
    /// Released journal runs taken up (K2.6), and of those, the runs followed.
    runs_met: AtomicU64,
    runs_followed: AtomicU64,
}

#[derive(Debug, Clone)]
struct Refusal {
    /// Monotonic ms of the registry's clock when a claim may pass.
    due_ms: u64,
    /// Background claims already refused.
    tries: u32,
    /// Monotonic ms of the refusal, and what it named: a request within `retry_ms` of it
    /// gets the same answer without a claim attempt ([`Warm::recent_refusal`]).
    at_ms: u64,
    holder: String,
    holder_addr: Option<String>,
    /// The refusal said the holder is draining (its Retry-After is then a second).
    draining: bool,
}

/// Why a background claim runs, and so what a refusal with a held lease means.
#[derive(Debug, Clone)]
pub(crate) enum Why {
    /// A draining process (this instance) lists the org: retry every `retry_ms` until
    /// `until_ms` (monotonic), while the org lease still names that process. With
    /// `check_first`, the org lease is read before the first attempt too: the drain was
    /// first seen already under way (this watcher just started), and may be long over,
    /// its orgs held by live successors, which a claim attempt would only disturb.
    Draining {
        instance: String,
        until_ms: u64,
        check_first: bool,
    },
    /// A request for it was refused; `tries` background claims were refused since.
    Refused { tries: u32 },
    /// A journal run's release seal freed it (K2.6): one attempt, and a refusal of any
    /// kind leaves it where it is.
    Released,
}

/// The wait, in ms of this registry's monotonic clock, a held-lease refusal names.
pub(crate) fn held_ms(e: &Error) -> Option<u64> {
    held(e).map(|(ms, _)| ms)
}

/// Who a held-lease refusal named: the holder, its address, and whether it was draining.
type Named = (String, Option<String>, bool);

/// A held-lease refusal's wait (ms), and the holder it named.
fn held(e: &Error) -> Option<(u64, Named)> {
    match e {
        Error::Replica { source, .. } => match &**source {
            idem_replica::Error::LeaseHeld {
                retry_after_ms,
                holder,
                holder_addr,
                draining,
                ..
            } => Some((
                *retry_after_ms,
                (holder.clone(), holder_addr.clone(), *draining),
            )),
            _ => None,
        },
        _ => None,
    }
}

impl Warm {
    pub(crate) fn new(settings: WarmSettings, poll_ms: u64, clock: Arc<dyn idem::Clock>) -> Warm {
        Warm {
            permits: Arc::new(Semaphore::new(settings.concurrency.max(1))),
            settings,
            poll_ms,
            clock,
            refused: std::sync::Mutex::new(HashMap::new()),
            claiming: std::sync::Mutex::new(HashSet::new()),
            wake: Notify::new(),
            claimed: AtomicU64::new(0),
            look_now: std::sync::atomic::AtomicBool::new(false),
            runs_met: AtomicU64::new(0),
            runs_followed: AtomicU64::new(0),
        }
    }

    /// Orgs opened by a background claim so far.
    pub(crate) fn claimed(&self) -> u64 {
        self.claimed.load(Ordering::Relaxed)
    }

    /// Released journal runs followed so far (K2.6).
    pub(crate) fn runs_followed(&self) -> u64 {
        self.runs_followed.load(Ordering::Relaxed)
    }

    /// Released journal runs taken up so far (K2.6): followed, too old, not learned, or
    /// passed over because the registry was shutting down or had no room.
    pub(crate) fn runs_met(&self) -> u64 {
        self.runs_met.load(Ordering::Relaxed)
    }

    /// How long a draining process keeps its lease listed after the write that announced
    /// the drain landed, before [`crate::Registry::shutdown`] deletes it: two of this
    /// watcher's polls, so a successor polling as often reads it at least once whatever
    /// the phase of its polls, as long as a poll's LIST and the GETs after it take less
    /// than a poll (`docs/design.md` 3f); at most [`DRAIN_LINGER_MAX_MS`]. A fleet runs one
    /// configuration: a process that watches at this period expects its successors to.
    /// Whether one is there cannot be known from here: a successor that holds nothing yet
    /// has no process lease to list.
    pub(crate) fn drain_linger(&self) -> Duration {
        Duration::from_millis(self.poll_ms.saturating_mul(2).min(DRAIN_LINGER_MAX_MS))
    }

    /// Background claims under way (each org once), waiting for a permit or running.
    pub(crate) fn claiming(&self) -> usize {
        lock(&self.claiming).len()
    }

    /// K2.6: follows the release seals `issuer`'s claims met (another process's drain), in
    /// the background: a seal younger than [`WarmSettings::follow_ms`] on the store's clock
    /// ([`idem_replica::Replica::store_time`]: a lower bound of the store's time now, set
    /// against the seal's Last-Modified, two readings of one clock, I15) has its run's orgs
    /// learned ([`idem_replica::Replica::released_run_orgs`]) and claimed as
    /// [`Why::Released`], so their next requests find them served. An older seal is an
    /// idle org's last holder gone long ago: claiming all its orgs now would only load this
    /// registry with tenants nobody asked it for. Nothing is learned or claimed once the
    /// registry shuts down or has no room.
    pub(crate) fn follow_released(
        self: &Arc<Self>,
        registry: &Registry,
        issuer: &idem_replica::journal::Issuer,
    ) {
        let runs = issuer.take_released();
        if runs.is_empty() {
            return;
        }
        let (warm, weak) = (self.clone(), registry.downgrade());
        let replica = registry.replica().clone();
        tokio::spawn(async move {
            for released in runs {
                warm.follow(&weak, &replica, released).await;
                warm.runs_met.fetch_add(1, Ordering::Relaxed);
            }
        });
    }

    /// [`Warm::follow_released`] for one run. The registry is held only between the reads,
    /// so a dropped one ends it.
    async fn follow(
        self: &Arc<Self>,
        weak: &Weak<RegistryInner>,
        replica: &idem_replica::Replica,
        released: idem_replica::journal::ReleasedRun,
    ) {
        let open = || {
            weak.upgrade()
                .map(Registry::from_inner)
                .filter(|r| !r.shutting_down() && r.has_room())
        };
        let run = &released.run;
        if open().is_none() {
            return;
        }
        let age_ms = match replica.store_time("follow a released run").await {
            Ok(t) => t.store_ms.saturating_sub(released.sealed_at_ms),
            Err(e) => {
                tracing::warn!(%run, error = %e, "warm takeover: a released run not followed, the store's time unknown");
                return;
            }
        };
        if age_ms >= self.settings.follow_ms {
            tracing::debug!(%run, age_ms, "warm takeover: a released run too old to follow");
            return;
        }
        let learned = match replica.released_run_orgs(run, released.seal).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(%run, error = %e, "warm takeover: a released run's orgs not learned");
                return;
            }
        };
        let Some(registry) = open() else {
            return;
        };
        self.runs_followed.fetch_add(1, Ordering::Relaxed);
        let mut started = 0usize;
        for org in learned.orgs {
            if registry.serving(&org).is_none() {
                started += 1;
                self.start(weak.clone(), org, Why::Released);
            }
        }
        tracing::info!(%run, seal = released.seal, age_ms, started, "warm takeover: following a released journal run");
    }

    /// Notes what a request's acquire of `org` came to: a held-lease refusal is remembered
    /// (first refusal, no background try yet), an open org is forgotten.
    pub(crate) fn after_request(&self, org: &OrgId, result: &Result<crate::Org, Error>) {
        match result {
            Ok(_) => {
                lock(&self.refused).remove(org);
            }
            Err(e) => {
                if let Some((wait_ms, named)) = held(e) {
                    self.look_now.store(true, Ordering::Relaxed);
                    self.remember(org, wait_ms, 0, Some(named));
                }
            }
        }
    }

    /// The refusal a request for `org` gets without a claim attempt: the org was refused
    /// with a held lease less than `retry_ms` ago, so a claim now would read the same log
    /// and the same process lease (a held org moves by a Release entry, which a draining
    /// holder's background claim picks up, or by its holder's silence for a whole watch,
    /// which a refusal `retry_ms` old does not shorten). Bounds a retrying client's claim
    /// attempts on an org to one per `retry_ms`, whatever its retry rate (I16). `None` when
    /// a claim should be tried.
    pub(crate) fn recent_refusal(&self, org: &OrgId) -> Option<Error> {
        let now = self.clock.monotonic_ms();
        let refused = lock(&self.refused);
        let r = refused.get(org)?;
        if now.saturating_sub(r.at_ms) >= self.settings.retry_ms || r.holder.is_empty() {
            return None;
        }
        Some(Error::Replica {
            org: org.clone(),
            source: Box::new(idem_replica::Error::LeaseHeld {
                org: org.to_string(),
                holder: r.holder.clone(),
                retry_after_ms: r.due_ms.saturating_sub(now).max(1),
                holder_addr: r.holder_addr.clone(),
                draining: r.draining,
            }),
        })
    }

    /// Remembers `org` to claim `wait_ms` from now, unless the bound is reached; `named`,
    /// the holder, its address and its draining a request's refusal named, lets later
    /// requests within `retry_ms` get that refusal again ([`Warm::recent_refusal`]).
    fn remember(&self, org: &OrgId, wait_ms: u64, tries: u32, named: Option<Named>) {
        let at_ms = self.clock.monotonic_ms();
        let due_ms = at_ms.saturating_add(wait_ms);
        let (holder, holder_addr, draining) = named.unwrap_or_default();
        {
            let mut refused = lock(&self.refused);
            if refused.len() >= self.settings.remember && !refused.contains_key(org) {
                tracing::debug!(%org, "warm takeover: refusal not remembered, bound reached");
                return;
            }
            refused.insert(
                org.clone(),
                Refusal {
                    due_ms,
                    tries,
                    at_ms,
                    holder,
                    holder_addr,
                    draining,
                },
            );
        }
        self.wake.notify_one();
    }

    /// Takes the remembered orgs now due; returns them and the monotonic ms the next one
    /// falls due, if any remain.
    fn take_due(&self) -> (Vec<(OrgId, u32)>, Option<u64>) {
        let now = self.clock.monotonic_ms();
        let mut refused = lock(&self.refused);
        let due: Vec<(OrgId, u32)> = refused
            .iter()
            .filter(|(_, r)| r.due_ms <= now)
            .map(|(o, r)| (o.clone(), r.tries))
            .collect();
        for (org, _) in &due {
            refused.remove(org);
        }
        let next = refused.values().map(|r| r.due_ms).min();
        (due, next)
    }

    /// Starts a background claim of `org` unless one runs already.
    fn start(self: &Arc<Self>, registry: Weak<RegistryInner>, org: OrgId, why: Why) {
        if !lock(&self.claiming).insert(org.clone()) {
            return;
        }
        let warm = self.clone();
        tokio::spawn(async move {
            warm.claim(registry, &org, why).await;
            lock(&warm.claiming).remove(&org);
        });
    }

    /// Claims `org` for `registry`, retrying as `why` says; holds the registry only while
    /// an attempt runs, so a dropped registry ends the task.
    async fn claim(&self, registry: Weak<RegistryInner>, org: &OrgId, why: Why) {
        if let Why::Draining {
            instance,
            check_first: true,
            ..
        } = &why
        {
            let Some(inner) = registry.upgrade() else {
                return;
            };
            match Registry::from_inner(inner).replica().lease(org).await {
                Ok(Some(lease)) if lease.instance == *instance => {}
                _ => return,
            }
        }
        loop {
            let Ok(permit) = self.permits.acquire().await else {
                return;
            };
            let Some(inner) = registry.upgrade() else {
                return;
            };
            let registry_now = Registry::from_inner(inner);
            if registry_now.shutting_down() {
                return;
            }
            if registry_now.serving(org).is_some() {
                return;
            }
            if !registry_now.has_room() {
                // A followed run names every org it held, so its misses are many and expected.
                if matches!(why, Why::Released) {
                    tracing::debug!(%org, "warm takeover: at the open or active org limit, not claiming");
                } else {
                    tracing::info!(%org, "warm takeover: at the open or active org limit, not claiming");
                }
                return;
            }
            let result = registry_now.acquire_unnoted(org).await;
            drop(permit);
            let e = match result {
                Ok(_) => {
                    self.claimed.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%org, "warm takeover: claimed in the background");
                    return;
                }
                Err(e) => e,
            };
            let Some(wait_ms) = held_ms(&e) else {
                if !matches!(e, Error::ShuttingDown { .. }) {
                    tracing::warn!(%org, error = %e, "warm takeover: background claim failed");
                }
                return;
            };
            match &why {
                Why::Released => return,
                Why::Refused { tries } => {
                    if tries + 1 < REFUSED_TRIES {
                        self.remember(org, wait_ms, tries + 1, None);
                    }
                    return;
                }
                Why::Draining {
                    instance, until_ms, ..
                } => {
                    if self.clock.monotonic_ms() >= *until_ms {
                        return;
                    }
                    // Another live process took the org (its lease names it): it stays there.
                    match registry_now.replica().lease(org).await {
                        Ok(Some(lease)) if lease.instance != *instance => return,
                        Err(_) => return,
                        _ => {}
                    }
                }
            }
            drop(registry_now);
            tokio::time::sleep(std::time::Duration::from_millis(
                self.settings.retry_ms.max(1),
            ))
            .await;
        }
    }

    /// How long the orgs a draining holder with lease term `term_ms` lists are retried:
    /// until this monotonic ms.
    fn draining_until(&self, term_ms: u64) -> u64 {
        self.clock
            .monotonic_ms()
            .saturating_add(term_ms.max(1_000).saturating_mul(DRAINING_TERMS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linger(poll_ms: u64) -> Duration {
        let clock: Arc<dyn idem::Clock> = Arc::new(idem::SystemClock);
        Warm::new(WarmSettings::default(), poll_ms, clock).drain_linger()
    }

    #[test]
    fn a_drain_stays_listed_two_polls_and_never_past_the_cap() {
        assert_eq!(linger(50), Duration::from_millis(100));
        assert_eq!(linger(crate::WARM_POLL_MS), Duration::from_secs(2));
        assert_eq!(linger(2_500), Duration::from_millis(DRAIN_LINGER_MAX_MS));
        assert_eq!(
            linger(3_600_000),
            Duration::from_millis(DRAIN_LINGER_MAX_MS)
        );
        assert_eq!(linger(u64::MAX), Duration::from_millis(DRAIN_LINGER_MAX_MS));
    }
}
