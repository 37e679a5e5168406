//! The org's shipping task: ships whenever some request waits for an unshipped commit,
//! confirms when replays and reads wait for a check that no successor appended (each one a
//! `crate::ship` call), and reports the tenure's end (`crate::tenure::end`) when it is
//! fenced or poisoned. An idle org's task waits and issues no store request:
//! the process lease keeps its claim alive (I14).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::metrics as m;
use crate::ship::{confirm_once, ship_once};
use crate::tenure::end::{End, Step, end};
use crate::tenure::state::Inner;

/// The org's shipper task; returns when the org stops.
pub(crate) async fn run(inner: Arc<Inner>) {
    let mut ships_since_retain = 0u64;
    let retain_interval = Duration::from_millis(inner.settings.retain_interval_ms);
    let mut last_retain = idem_base::Stopwatch::start();
    // One level compaction at a time per org, off the shipping path (it rebuilds a closed
    // chain from the store: `docs/design.md` 2d).
    let compacting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    loop {
        loop {
            if inner.acks.lock().stop.is_some() {
                return;
            }
            if inner.acks.has_demand() {
                break;
            }
            inner.acks.demand.notified().await;
        }
        let (shipped, full, journal) = {
            let mut publishing = inner.publishing().await;
            if inner.acks.lock().stop.is_some() {
                return;
            }
            // A waiter that arrived as the org parked: reopen and prove the file first.
            if crate::park::unpark_locked(&inner, &mut publishing)
                .await
                .is_err()
            {
                return;
            }
            let (shipped, full) = if inner.acks.needs_ship() && publishing.pipelined() {
                let before = inner.acks.counters.full_ships.load(Ordering::Relaxed);
                let shipped = crate::pipeline::ship_pipelined(&inner, &mut publishing).await;
                let full = inner.acks.counters.full_ships.load(Ordering::Relaxed) > before;
                (shipped, full)
            } else if inner.acks.needs_ship() {
                let before = inner.acks.counters.full_ships.load(Ordering::Relaxed);
                let shipped = ship_once(&inner, &mut publishing).await;
                let full = inner.acks.counters.full_ships.load(Ordering::Relaxed) > before;
                (shipped, full)
            } else {
                (confirm_once(&inner, &mut publishing).await, false)
            };
            // Poisoned (I13: nothing was published; a successor claims at once) or claim
            // lost (I7: acks nothing more): the tenure ends here.
            if let Err(e) = &shipped
                && let Some(how) = End::after(e, Step::Ship)
            {
                let _ = end(&inner, &mut publishing, how).await;
                return;
            }
            (shipped, full, publishing.is_journal())
        };
        // A failure that did not end the tenure is retryable: its commits ship later.
        if shipped.is_ok() {
            ships_since_retain += 1;
            let every = inner.settings.retain_every_ships;
            // Only a new full snapshot (for a journal org, a snapshot checkpoint) makes older
            // entries deletable; and at most one run per interval, so retention's requests
            // do not follow the acknowledgements.
            if every > 0
                && full
                && ships_since_retain >= every
                && last_retain.elapsed() >= retain_interval
            {
                ships_since_retain = 0;
                last_retain.restart();
                // A journal org's checkpoints have no level files (3g, "T4 as built").
                if !journal {
                    compact_in_background(&inner, &compacting);
                }
                match inner
                    .replica
                    .retain(&inner.acks.org, &inner.settings.retention)
                    .await
                {
                    Ok(report) => {
                        metrics::counter!(m::RETENTION_DELETED, "what" => "entries")
                            .increment(report.deleted_entries.len() as u64);
                        metrics::counter!(m::RETENTION_DELETED, "what" => "blobs")
                            .increment(report.deleted_blobs.len() as u64);
                    }
                    Err(e) => {
                        tracing::warn!(org = %inner.acks.org, error = %e, "retention failed")
                    }
                }
            }
        }
        if inner.settings.min_ship_interval_ms > 0 {
            tokio::time::sleep(Duration::from_millis(inner.settings.min_ship_interval_ms)).await;
        }
    }
}

/// Starts [`idem_replica::Replica::compact_levels`] for the org on its own task, unless one
/// is still running: a new full snapshot has just closed the chain before it. Its level file
/// lets the next retention run delete that chain's deltas once they are `keep_ms` old.
fn compact_in_background(inner: &Arc<Inner>, running: &Arc<std::sync::atomic::AtomicBool>) {
    if inner.settings.retention.level_ms == 0 || running.swap(true, Ordering::AcqRel) {
        return;
    }
    let (replica, org) = (inner.replica.clone(), inner.acks.org.clone());
    let (policy, running) = (inner.settings.retention.clone(), running.clone());
    tokio::spawn(async move {
        match replica.compact_levels(&org, &policy).await {
            Ok(report) => {
                metrics::counter!(m::LEVEL_FILES_WRITTEN).increment(report.written.len() as u64)
            }
            Err(e) => tracing::warn!(%org, error = %e, "level compaction failed"),
        }
        running.store(false, Ordering::Release);
    });
}
