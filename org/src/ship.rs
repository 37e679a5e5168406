//! One ship or one confirmation, under the shipper lock: what the shipper task, a park and a
//! release run to publish (group commit) or to confirm that no successor appended (I6, I7).

use std::sync::atomic::Ordering;

use idem_replica::ShipKind;

use crate::Error;
use crate::metrics as m;
use crate::tenure::publishing::Publisher;
use crate::tenure::state::Inner;

/// Ships everything committed so far and settles the waiters it covers (group commit: one
/// ship acknowledges every request whose commit it holds).
///
/// # Errors
/// `Poisoned` or `Fenced` (the org has stopped when this returns); `ShipFailed` (the waiters
/// the ship would have acknowledged failed with it; their commits ship with a later ship).
pub(crate) async fn ship_once(inner: &Inner, shipper: &mut Publisher) -> Result<(), Error> {
    let span = tracing::info_span!(
        "ship",
        org = %inner.acks.org,
        round = inner.acks.round,
        seq = tracing::field::Empty,
        commit_seq = tracing::field::Empty,
    );
    tracing::Instrument::instrument(ship_traced(inner, shipper), span).await
}

async fn ship_traced(inner: &Inner, shipper: &mut Publisher) -> Result<(), Error> {
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
pub(crate) async fn confirm_once(inner: &Inner, shipper: &mut Publisher) -> Result<(), Error> {
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
