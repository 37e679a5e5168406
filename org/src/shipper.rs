//! The org's shipping task: ships whenever some request waits for an unshipped commit,
//! confirms when replays and reads wait for a check that no successor appended, and ends the
//! org when it is fenced or poisoned. An idle org's task waits and issues no store request:
//! the process lease keeps its claim alive (I14).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_replica::{ShipKind, Shipper};

use crate::Error;
use crate::metrics as m;
use crate::org::Inner;

/// Ships everything committed so far and settles the waiters it covers (group commit: one
/// ship acknowledges every request whose commit it holds).
///
/// # Errors
/// `Poisoned` or `Fenced` (the org has stopped when this returns); `ShipFailed` (the waiters
/// the ship would have acknowledged failed with it; their commits ship with a later ship).
pub(crate) async fn ship_once(inner: &Inner, shipper: &mut Shipper) -> Result<(), Error> {
    let span = tracing::info_span!(
        "ship",
        org = %inner.acks.org,
        round = inner.acks.round,
        seq = tracing::field::Empty,
        commit_seq = tracing::field::Empty,
    );
    tracing::Instrument::instrument(ship_traced(inner, shipper), span).await
}

async fn ship_traced(inner: &Inner, shipper: &mut Shipper) -> Result<(), Error> {
    let acks = &inner.acks;
    let start = acks.lock().begin();
    let covering = acks.commit_seq.get();
    let began = idem_base::Stopwatch::start();
    let report = match shipper.ship(&*inner.writer).await {
        Ok(r) => r,
        Err(e) => return Err(acks.failed(start, covering, e)),
    };
    let span = tracing::Span::current();
    span.record("seq", report.seq);
    span.record("commit_seq", report.commit_seq);
    let kind = match report.kind {
        ShipKind::Full => "full",
        ShipKind::Delta => "delta",
        ShipKind::Compacted => "compacted",
    };
    metrics::histogram!(m::SHIP_SECONDS, "kind" => kind).record(m::seconds(began.elapsed()));
    metrics::counter!(m::SHIPS, "kind" => kind).increment(1);
    metrics::counter!(m::SHIPPED_BYTES).increment(report.bytes);
    let c = &acks.counters;
    c.ships.fetch_add(1, Ordering::Relaxed);
    match report.kind {
        ShipKind::Full => {
            c.full_ships.fetch_add(1, Ordering::Relaxed);
            c.full_bytes.fetch_add(report.bytes, Ordering::Relaxed);
        }
        ShipKind::Compacted => {
            c.compactions.fetch_add(1, Ordering::Relaxed);
        }
        ShipKind::Delta => {}
    }
    c.bytes_shipped.fetch_add(report.bytes, Ordering::Relaxed);
    let acked = acks.confirmed(start, report.commit_seq);
    tracing::debug!(org = %acks.org, round = acks.round, seq = report.seq, commit_seq = report.commit_seq, kind = ?report.kind, bytes = report.bytes, acks = acked, "shipped");
    Ok(())
}

/// Confirms, without shipping, that no successor appended and the files are unchanged, then
/// acknowledges the replays and reads waiting for a confirmation (I6, I7, I13).
async fn confirm_once(inner: &Inner, shipper: &mut Shipper) -> Result<(), Error> {
    let acks = &inner.acks;
    let (start, shipped) = {
        let mut st = acks.lock();
        (st.begin(), st.shipped)
    };
    match shipper.confirm().await {
        Ok(()) => {
            acks.confirmed(start, shipped);
            Ok(())
        }
        Err(e) => Err(acks.failed(start, shipped, e)),
    }
}

/// The org's shipper task; returns when the org stops.
pub(crate) async fn run(inner: Arc<Inner>) {
    let mut ships_since_retain = 0u64;
    let retain_interval = Duration::from_millis(inner.settings.retain_interval_ms);
    // Paces retention only (at most one run per interval); decides nothing a test controls.
    let mut last_retain = idem_base::Stopwatch::start();
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
        let (shipped, full) = {
            let mut shipper = inner.shipper.lock().await;
            if inner.acks.lock().stop.is_some() {
                return;
            }
            // A waiter that arrived as the org parked: reopen and prove the file first.
            if crate::park::unpark_locked(&inner, &mut shipper)
                .await
                .is_err()
            {
                return;
            }
            if inner.acks.needs_ship() {
                let before = inner.acks.counters.full_ships.load(Ordering::Relaxed);
                let shipped = ship_once(&inner, &mut shipper).await;
                let full = inner.acks.counters.full_ships.load(Ordering::Relaxed) > before;
                (shipped, full)
            } else {
                (confirm_once(&inner, &mut shipper).await, false)
            }
        };
        match shipped {
            Err(Error::Poisoned { .. }) => {
                // I13: nothing was published; end the round so a successor (this process on
                // its next acquire, or another replica) claims at once and hydrates.
                if let Err(e) = inner.shipper.lock().await.release().await {
                    tracing::warn!(org = %inner.acks.org, round = inner.acks.round, error = %e, "release after poisoning failed");
                }
                inner.close().await;
                return;
            }
            Err(Error::Fenced { .. } | Error::ClaimLost { .. }) => {
                // I7: a writer whose claim is lost acks nothing more and discards its local
                // database.
                inner.close().await;
                return;
            }
            Ok(()) => {
                ships_since_retain += 1;
                let every = inner.settings.retain_every_ships;
                // Only a new full snapshot makes older entries deletable; and at most one run
                // per interval, so retention's requests do not follow the acknowledgements.
                if every > 0
                    && full
                    && ships_since_retain >= every
                    && last_retain.elapsed() >= retain_interval
                {
                    ships_since_retain = 0;
                    last_retain.restart();
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
            Err(_) => {}
        }
        if inner.settings.min_ship_interval_ms > 0 {
            tokio::time::sleep(Duration::from_millis(inner.settings.min_ship_interval_ms)).await;
        }
    }
}
