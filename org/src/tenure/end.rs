//! How an org's tenure ends: the one table every path reports to (the shipper task, a park,
//! an unpark, a release, an eviction, a shutdown), and the one function that carries it out.
//!
//! ```text
//! End                         the claim             stop         local files
//! Poisoned   (I13)            released: nothing     poisoned     discarded
//!   a ship or confirmation,   was published, a      (already)
//!   a park or an unpark found successor claims
//!   the files changed, or a   at once
//!   ship a park needed did
//! ClaimLost  (I7)             gone: nothing more    fenced /     discarded
//!   fenced, or the claim can  is published          claim lost
//!   no longer publish                               (already)
//! Released                    released after the    closed       kept for a later acquire
//!   graceful release, an      final ship (Release                on this host when asked
//!   eviction, a shutdown      entry)                             and the release landed;
//!                                                                else discarded
//! Abandoned                   kept until a          closed       discarded
//!   a release that could not  successor fences it
//!   ship its final state      or the lease lapses
//! ```
//! Every end runs under the shipper lock ([`Publishing`]), so nothing publishes after the
//! decision, and closes the writer before its descriptors (I13).

use idem_replica::ResumePoint;

use super::publishing::{Publisher, Publishing};
use super::state::Inner;
use crate::Error;
use crate::ack::Stop;
use crate::sync::lock;

/// Every way an org's tenure ends (the module's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The org's files were found changed outside the writer (I13), at `at`.
    Poisoned { at: Step },
    /// Fenced by a successor's claim, or the claim can no longer publish (I7), at `at`.
    ClaimLost { at: Step },
    /// A release whose final state shipped: publish the Release entry; keep the closed
    /// database file for a later acquire on this host when `keep` and that lands.
    Released { keep: bool },
    /// A release that could not ship its final state (the drain found the writer gone, or
    /// the ship failed and may be retried by a successor's hydrate of what was published).
    Abandoned,
}

/// Where an end was found, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The shipper task's ship or confirmation.
    Ship,
    /// A ship a park needed first.
    ParkShip,
    /// A park's checkpoint.
    Park,
    /// An unpark's proof of the file.
    Unpark,
    /// A release's final ship.
    ReleaseShip,
}

impl End {
    /// The end a ship's or confirmation's error reports at `at`; `None` when the org serves
    /// on (a retryable failure: the commits ship with a later ship).
    pub(crate) fn after(e: &Error, at: Step) -> Option<End> {
        match e {
            Error::Poisoned { .. } => Some(End::Poisoned { at }),
            Error::Fenced { .. } | Error::ClaimLost { .. } => Some(End::ClaimLost { at }),
            _ => None,
        }
    }
}

/// Ends `inner`'s tenure for `end` as the module's table says: releases the claim or not,
/// stops the org (the first reason to stop stays), closes the writer (queued jobs finish; the
/// connection closes before its descriptors) and keeps or discards the local files.
///
/// # Errors
/// For [`End::Released`] only, the Release entry's error (the files are then discarded);
/// a failed release after poisoning is logged: the successor fences this claim instead.
pub(crate) async fn end(
    inner: &Inner,
    publishing: &mut Publishing<'_>,
    end: End,
) -> Result<(), Error> {
    let (org, round) = (&inner.acks.org, inner.acks.round);
    let (result, kept) = match end {
        // A journal org's files are not the writer's any more: nothing is captured from
        // them, and the tenure stays held by the run until this process ends (J4 needs a
        // released section of the org's own state).
        End::Poisoned { .. } if matches!(**publishing, Publisher::Journal(_)) => (Ok(()), None),
        End::Poisoned { .. } => {
            if let Err(e) = publishing.release(&*inner.writer).await {
                tracing::warn!(org = %org, round, error = %e, "release after poisoning failed");
            }
            (Ok(()), None)
        }
        // A journal tenure that ends without its Release entry stays counted by the run
        // (T3: walks still enter the run at its entry) until the process ends or this
        // process takes the org again.
        End::ClaimLost { .. } | End::Abandoned => (Ok(()), None),
        End::Released { keep } => match publishing.release(&*inner.writer).await {
            Ok(()) => (Ok(()), keep.then(|| publishing.resume_point()).flatten()),
            Err(e) => (Err(Error::replica(org, e)), None),
        },
    };
    // Stop while still holding the shipper lock, so a shipper task waiting for it finds the
    // org stopped instead of shipping on an ended claim.
    let released = matches!(end, End::Released { .. }) && result.is_ok();
    inner.acks.stop(if released {
        Stop::Released
    } else {
        Stop::Closed
    });
    close(inner, kept.as_ref()).await;
    tracing::debug!(org = %org, round, end = ?end, kept = kept.is_some(), "tenure ended");
    result
}

/// Closes the writer and keeps the closed database file when `kept` names the released
/// position it holds, else deletes the local files.
async fn close(inner: &Inner, kept: Option<&ResumePoint>) {
    inner.writer.close().await;
    inner.active.remove(inner.serial);
    let files = lock(&inner.files).take();
    if let Some(files) = files {
        match kept {
            Some(point) => files.keep(point),
            None => files.remove(),
        }
        // Once per org: the files are taken once.
        metrics::gauge!(crate::metrics::OPEN_ORGS).decrement(1.0);
    }
    inner.closed.send_replace(true);
}
