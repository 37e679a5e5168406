//! The watcher task: one LIST of `processes/` per poll, a GET of each process lease whose
//! version changed, background claims of what a draining process lists and of the refused
//! orgs now due.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use idem_replica::OrgId;

use super::{Warm, Why};
use crate::registry::{Registry, RegistryInner};

/// Starts the watcher of `registry`: it holds the registry weakly and ends when the
/// registry is dropped or shuts down. `poll_ms` is the period between LISTs.
pub(crate) fn spawn(registry: &Registry, warm: Arc<Warm>, poll_ms: u64) {
    let weak = registry.downgrade();
    let own = registry.replica().instance().to_owned();
    tokio::spawn(async move {
        // Version last listed of each other process's lease.
        let mut versions: HashMap<String, String> = HashMap::new();
        // A fixed schedule, the first LIST at once; missed ticks are not made up in a burst.
        let mut ticks = tokio::time::interval(Duration::from_millis(poll_ms.max(1)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut next_due: Option<u64> = None;
        // Monotonic ms of the registry's clock at the last early LIST.
        let mut looked_early_ms: Option<u64> = None;
        loop {
            // Wake for the next LIST, or sooner when a refusal falls due (the clock is the
            // registry's, read again on waking) or a new one is remembered.
            let until_due = next_due.map(|due_ms| {
                Duration::from_millis(due_ms.saturating_sub(warm.clock.monotonic_ms()).max(10))
            });
            let listing = tokio::select! {
                _ = ticks.tick() => true,
                () = sleep_or_never(until_due) => false,
                () = warm.wake.notified() => false,
            };
            let Some(registry) = weak.upgrade().map(Registry::from_inner) else {
                return;
            };
            if registry.shutting_down() {
                return;
            }
            // A request refused with a held lease: its holder may be draining, and a LIST now
            // finds out a poll sooner (rate-limited, so refusals cost at most one LIST per
            // `retry_ms`).
            let now_ms = warm.clock.monotonic_ms();
            let early = !listing
                && warm.look_now.load(std::sync::atomic::Ordering::Relaxed)
                && looked_early_ms
                    .is_none_or(|t| now_ms.saturating_sub(t) >= warm.settings.retry_ms);
            if early {
                warm.look_now
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                looked_early_ms = Some(now_ms);
            }
            if listing || early {
                look(&registry, &warm, &weak, &own, &mut versions).await;
            }
            let (due, next) = warm.take_due();
            next_due = next;
            for (org, tries) in due {
                warm.start(weak.clone(), org, Why::Refused { tries });
            }
        }
    });
}

/// Sleeps for `d`, or forever when `None`.
async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Lists `processes/`, GETs the leases that changed, and starts claims of the orgs a
/// draining one lists. A store error is logged; the next poll tries again.
async fn look(
    registry: &Registry,
    warm: &Arc<Warm>,
    weak: &Weak<RegistryInner>,
    own: &str,
    versions: &mut HashMap<String, String>,
) {
    let listed = match registry.replica().process_leases().await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "warm takeover: could not list process leases");
            return;
        }
    };
    versions.retain(|instance, _| listed.iter().any(|l| l.instance == *instance));
    for listing in listed {
        if listing.instance == own || versions.get(&listing.instance) == Some(&listing.version) {
            continue;
        }
        let lease = match registry.replica().process_lease(&listing.instance).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(instance = %listing.instance, error = %e, "warm takeover: could not read a process lease");
                continue;
            }
        };
        // Seen before this change: a drain that began while this watcher looked.
        let known = versions
            .insert(listing.instance.clone(), listing.version)
            .is_some();
        let Some(lease) = lease.filter(|l| l.draining) else {
            continue;
        };
        let until_ms = warm.draining_until(lease.term_ms);
        let mut started = 0usize;
        // Validated before they name anything (I12): an id another process wrote.
        for org in lease.releasing.iter().filter_map(|o| OrgId::new(o).ok()) {
            if registry.serving(&org).is_some() {
                continue;
            }
            started += 1;
            warm.start(
                weak.clone(),
                org,
                Why::Draining {
                    instance: lease.instance.clone(),
                    until_ms,
                    check_first: !known,
                },
            );
        }
        tracing::info!(instance = %lease.instance, orgs = lease.releasing.len(), started, "warm takeover: a process is draining");
    }
}
