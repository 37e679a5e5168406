//! Shipping with several ships in flight (`docs/design.md` 3e), for a claim whose window is
//! above 1: each ship holds everything committed when it was issued, ships land in any
//! order, and the waiters are acknowledged in slot order only, by the prefix of ships that
//! resolved (I6, W2). A failed ship ends the tenure; nothing issued after it is
//! acknowledged (I7, W3).
//!
//! ```text
//! while a waiter needs an unissued commit and the window has room:  issue (capture + pack)
//! next landing -> settle -> acknowledged prefix -> wake every waiter it covers
//! a full snapshot due -> let every ship in flight settle, then ship it alone (W4)
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use idem_replica::Issued;

use crate::Error;
use crate::ship::ship_once;
use crate::tenure::publishing::Publisher;
use crate::tenure::state::Inner;

/// Ships until no waiter needs an unshipped commit and nothing is in flight.
///
/// # Errors
/// `Fenced`/`ClaimLost` (the claim ended: a ship failed, W3), `Poisoned`, or a retryable
/// `ShipFailed` from a capture or a full snapshot, as [`ship_once`].
pub(crate) async fn ship_pipelined(inner: &Inner, publisher: &mut Publisher) -> Result<(), Error> {
    let Some(shipper) = publisher.per_org() else {
        return ship_once(inner, publisher).await;
    };
    let acks = &inner.acks;
    let mut flying = FuturesUnordered::new();
    // Start number of each ship's confirmation, by slot, until its prefix is acknowledged.
    let mut starts: BTreeMap<u64, u64> = BTreeMap::new();
    let mut issued = acks.lock().shipped;
    let mut full_due = false;
    let mut result = Ok(());
    loop {
        while !full_due && result.is_ok() && shipper.room() > 0 && acks.needs_ship_after(issued) {
            let start = acks.lock().begin();
            let covering = acks.commit_seq.get();
            match shipper.issue(&*inner.writer).await {
                Ok(Issued::Ship(ship)) => {
                    let ship = *ship;
                    issued = ship.commit();
                    starts.insert(ship.seq(), start);
                    let replica = inner.replica.clone();
                    flying.push(async move {
                        let landing = replica.land(&ship).await;
                        (ship, landing)
                    });
                }
                Ok(Issued::Full) => full_due = true,
                Err(e) => result = Err(acks.failed(start, covering, e)),
            }
        }
        // Wait for a landing, or for a waiter that needs a ship the window has room for.
        let issuing = !full_due && result.is_ok() && shipper.room() > 0;
        let next = if issuing && !flying.is_empty() {
            tokio::select! {
                next = flying.next() => next,
                () = acks.demand.notified() => continue,
            }
        } else {
            flying.next().await
        };
        let Some((ship, landing)) = next else {
            break;
        };
        let bytes = ship.shipped().uploaded_bytes;
        match shipper.settle(ship, landing) {
            Ok(acked) => {
                let c = &acks.counters;
                c.ships.fetch_add(1, Ordering::Relaxed);
                c.bytes_shipped.fetch_add(bytes, Ordering::Relaxed);
                if let Some(acked) = acked {
                    let start = starts.get(&acked.seq).copied().unwrap_or(0);
                    starts.retain(|seq, _| *seq > acked.seq);
                    acks.confirmed(start, acked.commit);
                }
            }
            // The claim ended (W3): every waiter fails with it, whatever is still in flight.
            Err(e) => return Err(acks.lose_claim(&e)),
        }
    }
    result?;
    if full_due {
        return ship_once(inner, publisher).await;
    }
    Ok(())
}
