//! One adoption of a dead writer's run at a time in this process (K2). A crash takeover
//! starts the acquires of a dead writer's orgs together, and each walk ends in that run. One
//! adopt seal fences every org of the run, so one acquire places it (the leader) and the
//! others that met the run meanwhile wait for that attempt to end and walk again, meeting
//! the seal. Without this, every one of them listed the run, met or collided with the seal,
//! and learned the run's orgs again: a listing of the run and a set of all its orgs per org,
//! quadratic over a takeover, for nothing a single adopter does not already do.
//!
//! The gate orders requests of this process only; it decides nothing. A waiter walks again
//! and applies the same rules to what it reads (I7: the seal in the store is what fences,
//! whoever placed it). The leader's attempt ending in any way releases the waiters, and
//! they learn whether it settled: adopted (the seal placed, the run's orgs learned) or
//! found the run released or adopted by another process. An attempt that did not settle —
//! an error, or its acquire dropped, perhaps after its seal landed — leaves the waiters to
//! adopt on their own, as every acquire did before the gate: a walk after our seal cannot
//! tell a finished adoption from one cut short, so an unsettled one must be finished by a
//! caller that does what `adopt_run` does after the seal (its hole fill, the floor held
//! for the seal, the run's orgs learned), and concurrently, so a failing store is never
//! waited on in turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::format::journal::RunName;

/// The runs being adopted by an acquire of this process, each with the gate its leader
/// holds.
#[derive(Debug, Default)]
pub(crate) struct Adopting {
    gates: Mutex<HashMap<RunName, Arc<AsyncMutex<bool>>>>,
}

/// An acquire's turn at adopting a run.
pub(crate) enum Turn<'a> {
    /// Adopt it: no other acquire of this process is adopting it. Dropping the lead (at
    /// the attempt's end, whatever it came to) releases the waiters; [`Lead::settle`]
    /// first tells them it came to an outcome.
    Lead(Lead<'a>),
    /// Another acquire is adopting it: wait for its attempt to end ([`Waiting::ended`]),
    /// then walk again.
    Wait(Waiting),
}

/// A waiter's view of the leader's gate.
pub(crate) struct Waiting(Arc<AsyncMutex<bool>>);

impl Waiting {
    /// Returns once the leader's attempt has ended: true when it settled (walk again),
    /// false when it did not (adopt without the gate).
    pub(crate) async fn ended(self) -> bool {
        *self.0.lock().await
    }
}

/// The leader's hold on a run's gate.
pub(crate) struct Lead<'a> {
    adopting: &'a Adopting,
    run: RunName,
    held: OwnedMutexGuard<bool>,
}

impl Lead<'_> {
    /// The attempt came to an outcome: the run adopted by this acquire, or found released
    /// or adopted by another process. Waiters then walk again.
    pub(crate) fn settle(&mut self) {
        *self.held = true;
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        // The entry goes before the guard (a field, dropped after this body) releases the
        // waiters: an acquire arriving later leads an attempt of its own.
        idem_base::lock(&self.adopting.gates).remove(&self.run);
    }
}

impl Adopting {
    /// The turn of an acquire that is about to adopt `run`.
    pub(crate) fn turn(&self, run: &RunName) -> Turn<'_> {
        let mut gates = idem_base::lock(&self.gates);
        if let Some(gate) = gates.get(run) {
            return Turn::Wait(Waiting(gate.clone()));
        }
        let gate = Arc::new(AsyncMutex::new(false));
        match gate.clone().try_lock_owned() {
            Ok(held) => {
                gates.insert(run.clone(), gate);
                Turn::Lead(Lead {
                    adopting: self,
                    run: run.clone(),
                    held,
                })
            }
            // A gate nobody else has seen is never locked; were it, waiting on it is safe.
            Err(_) => Turn::Wait(Waiting(gate)),
        }
    }

    /// Runs being adopted now (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        idem_base::lock(&self.gates).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(n: u64) -> Result<RunName, crate::Error> {
        RunName::new("0123456789abcdef0123456789abcdef", n)
    }

    #[tokio::test]
    async fn one_acquire_leads_a_runs_adoption_and_the_others_wait_for_its_end()
    -> Result<(), crate::Error> {
        let adopting = Adopting::default();
        let (a, b) = (run(1)?, run(2)?);
        let mut lead = match adopting.turn(&a) {
            Turn::Lead(l) => l,
            Turn::Wait(_) => panic!("the first acquire waited"),
        };
        // Another run has its own leader.
        assert!(matches!(adopting.turn(&b), Turn::Lead(_)));
        let Turn::Wait(waiting) = adopting.turn(&a) else {
            panic!("a second leader of one run");
        };
        let mut waiting = Box::pin(waiting.ended());
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        lead.settle();
        drop(lead);
        assert_eq!(
            futures::poll!(waiting.as_mut()),
            std::task::Poll::Ready(true)
        );
        // The attempt ended: the next acquire leads one of its own. One that ends without
        // settling (an error, a dropped acquire) tells its waiters so.
        assert_eq!(adopting.len(), 0);
        let Turn::Lead(unsettled) = adopting.turn(&a) else {
            panic!("no leader after the first attempt ended");
        };
        let Turn::Wait(waiting) = adopting.turn(&a) else {
            panic!("a second leader of one run");
        };
        drop(unsettled);
        assert!(!waiting.ended().await);
        Ok(())
    }
}
