//! A graceful release (a caller's, an eviction's, a shutdown's): drain, ship what is
//! unshipped, publish a Release entry, close; reported to [`super::end`].

use super::end::{End, Step, end};
use crate::ack::Stop;
use crate::{Error, Org};

impl Org {
    /// Graceful handoff: refuses new requests, lets queued ones commit (a drain), ships what
    /// is unshipped, publishes a Release entry (so the next claim proceeds at once), closes
    /// the database, and keeps its file for a later acquire on this host
    /// ([`crate::RegistrySettings::reuse_released_files`]; the next acquire uses it only if the store
    /// proves it current) or deletes the local files.
    ///
    /// A handle already released (its release succeeded) answers Ok again.
    ///
    /// # Errors
    /// The final ship's or the release's error; the handle is closed either way.
    /// [`Error::Poisoned`] when a parked journal org's file, reopened to capture its
    /// released section, is not the acknowledged state (I13): nothing of it is published.
    pub async fn release(&self) -> Result<(), Error> {
        let span = tracing::info_span!(
            "release",
            org = %self.inner().acks.org,
            round = self.inner().acks.round,
        );
        tracing::Instrument::instrument(self.release_traced(), span).await
    }

    async fn release_traced(&self) -> Result<(), Error> {
        let inner = self.inner();
        // Effect protocols running here settle first (a successor could only find their
        // reservations in progress, then AMBIGUOUS); a hung executor holds the release no
        // longer than its lease.
        let unsettled = inner.effects.wait_idle().await;
        if unsettled > 0 {
            tracing::warn!(org = %inner.acks.org, round = inner.acks.round, unsettled, "releasing with effect executors still running past their leases");
        }
        let keep = inner.settings.reuse_released_files;
        // Wait for a ship in flight first.
        let mut publishing = inner.publishing().await;
        // A parked journal org's release captures a released section: reopen and prove the
        // file first (a failed proof has poisoned and ended the tenure).
        let stopped = inner.acks.lock().stop.is_some();
        if !stopped && publishing.release_captures() && inner.writer.parked() {
            crate::park::unpark_locked(inner, &mut publishing).await?;
        }
        let drained = inner.writer.drain().await;
        let stopped = inner.acks.lock().stop.clone();
        let (shipped, how) = match stopped {
            // Released already (this handle twice, or J7's release of a lagging journal org
            // racing a shutdown): nothing is left to do.
            Some(Stop::Released) => return Ok(()),
            // Already ended (or ending) by the path that stopped it.
            Some(stop) => (Err(inner.acks.stop_error(stop)), End::Abandoned),
            None if !drained => (Err(inner.acks.stop_error(Stop::Closed)), End::Abandoned),
            None => {
                let unshipped = inner.acks.commit_seq.get() > inner.acks.lock().shipped;
                // A continued chain whose file differs from its tip (SQLite's switch to
                // WAL mode rewrote page 1) ships once, so the kept file is the published
                // position. A failed check ships too: the ship's capture repeats it
                // and reports what it finds.
                let differs = keep && publishing.inherited_unshipped().await.unwrap_or(true);
                let shipped = if unshipped || differs {
                    crate::ship::ship_once(inner, &mut publishing).await
                } else {
                    Ok(())
                };
                let how = match &shipped {
                    Ok(()) => End::Released { keep },
                    Err(e) => End::after(e, Step::ReleaseShip).unwrap_or(End::Abandoned),
                };
                (shipped, how)
            }
        };
        let ended = end(inner, &mut publishing, how).await;
        drop(publishing);
        let result = shipped.and(ended);
        tracing::info!(org = %inner.acks.org, round = inner.acks.round, ok = result.is_ok(), "released");
        result
    }
}
