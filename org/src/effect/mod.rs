//! External effects on an acquired org: reserve → execute → settle, each write acknowledged
//! only after a ship (I6), so a handoff between reserve and execute cannot let a successor
//! execute again; the protocol runs as its own task, so a caller that gives up never loses a
//! settlement.
//!
//! ```text
//! caller ─► task: reserve (bumps the commit counter in the same tx) ─► wait_shipped ─┐
//!   ┌────────────────────────────────────────────────────────────────────────────────┘
//!   └─► executor (a task / blocking thread; no transaction open)
//!         ─► writer: settle (conditional UPDATE + counter bump) ─► wait_shipped ─► Ok
//! ```
//! A successor hydrates every acknowledged reservation, so it finds the key RESERVED by the old
//! writer's attempt (in progress) and, once the lease lapses by its own observation
//! ([`holder`]), AMBIGUOUS — never free to run.
//!
//! Files: `holder` (this handle as the holder: label, running protocols, lapse rule),
//! `protocol` (the task), `job` (the writer-thread side), `gauge` (open effects in `/metrics`).

mod gauge;
pub(crate) mod holder;
mod protocol;

use idem::effect::{self, Effect, Resolution, State, Transition};

pub use gauge::OpenEffects;
use protocol::Executor;

use crate::commit::Answer;
use crate::writer::job::{EffectJob, Job, Reply, Work};
use crate::{Error, Org};

impl Org {
    /// Runs an external effect (payment, email, webhook) at most once for `key` in the org's
    /// acknowledged history, across handoffs (E1 with I6): the reservation is shipped before
    /// `executor` starts, and the settlement is shipped before this returns `Ok`.
    ///
    /// The whole protocol runs as a task of its own; this call only waits for its answer. A
    /// caller dropped at any point — before the reservation lands, while the executor runs,
    /// during the settlement — leaves it running to the end: an executor's `Ok` is recorded
    /// COMMITTED and replayed to the retry. A call for a key whose protocol is running in
    /// this process waits for that protocol, then answers from what it recorded (a replay)
    /// instead of "in progress".
    ///
    /// `executor` runs as a tokio task with no transaction open. `Ok(bytes)` → COMMITTED and
    /// replayed to every later call; [`effect::Error::NotExecuted`] → FAILED (a later call runs
    /// it again); [`effect::Error::Ambiguous`] or a panic → AMBIGUOUS. The reservation names
    /// this handle as holder (writer id, process instance, round), whatever `opts` says, and
    /// its lease is judged by this handle's rule (`docs/effects.md`, "Whose clock").
    ///
    /// # Errors
    /// [`Error::Idem`] carrying `EffectInProgress` (retry later: another round's reservation
    /// still inside its term), `EffectAmbiguous` (needs [`Org::resolve`]),
    /// `EffectNotExecuted`, `EffectResultNotKept` (it executed; its result was larger than
    /// `effect::Options::max_result_bytes`), or the commit errors of `idem::effect::reserve`
    /// (the executor did not run); [`Error::EffectUnacknowledged`] after an executor's `Ok`
    /// whose settlement is not acknowledged, carrying its result; [`Error::ShipFailed`] (retry
    /// with the key: the reservation was not acknowledged, so the executor did not run and
    /// the key reads FAILED); [`Error::Fenced`] / [`Error::Closed`]: acquire again;
    /// [`Error::Task`] if the protocol's task itself failed.
    pub async fn effect<F, Fut>(
        &self,
        key: &str,
        opts: effect::Options,
        executor: F,
    ) -> Result<effect::Outcome, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Vec<u8>, effect::Error>> + Send + 'static,
    {
        let executor = Executor::Async(Box::new(move || Box::pin(executor())));
        self.spawn_effect(key, opts, executor).await
    }

    /// [`Org::effect`] for a blocking executor, run on tokio's blocking pool.
    ///
    /// # Errors
    /// As [`Org::effect`].
    pub async fn effect_blocking<F>(
        &self,
        key: &str,
        opts: effect::Options,
        executor: F,
    ) -> Result<effect::Outcome, Error>
    where
        F: FnOnce() -> Result<Vec<u8>, effect::Error> + Send + 'static,
    {
        self.spawn_effect(key, opts, Executor::Blocking(Box::new(executor)))
            .await
    }

    async fn spawn_effect(
        &self,
        key: &str,
        opts: effect::Options,
        executor: Executor,
    ) -> Result<effect::Outcome, Error> {
        // Detached: dropping this call's future drops only the JoinHandle.
        let task = tokio::spawn(protocol::run(self.clone(), key.to_owned(), opts, executor));
        task.await.map_err(|source| Error::Task {
            org: self.id().clone(),
            op: "running an effect",
            source,
        })?
    }

    /// The effect row of `key` as this writer judges it (a reservation whose lease lapsed
    /// reads AMBIGUOUS), once every commit so far is shipped.
    ///
    /// # Errors
    /// As [`Org::applied`].
    pub async fn effect_record(&self, key: &str) -> Result<Option<Effect>, Error> {
        let rows = self.read_effects(Some(key.to_owned()), None).await?;
        Ok(rows.into_iter().next())
    }

    /// Every effect row, or those in `state`, as this writer judges them (a reservation
    /// whose lease lapsed is listed as AMBIGUOUS), once every commit so far is shipped.
    ///
    /// # Errors
    /// As [`Org::applied`].
    pub async fn effects(&self, state: Option<State>) -> Result<Vec<Effect>, Error> {
        self.read_effects(None, state).await
    }

    /// Every recorded transition of `key` (who, when, what), oldest first, once every
    /// commit so far is shipped.
    ///
    /// # Errors
    /// As [`Org::applied`].
    pub async fn effect_history(&self, key: &str) -> Result<Vec<Transition>, Error> {
        let key = key.to_owned();
        let Answer {
            value: rows,
            commit_seq,
        } = self
            .effect_job(|reply| Work::History { key, reply })
            .await?;
        self.wait_confirmed(commit_seq).await?;
        Ok(rows)
    }

    /// Resolves an AMBIGUOUS effect — a reservation whose lease lapsed by this writer's rule
    /// included — as executed (with its result) or not executed (see
    /// `idem::effect::resolve`), recorded with `by` and the registry clock's time, and
    /// acknowledged after a ship. This is the resolve the holder performs itself: an operator
    /// beside a running server resolves through it (`idem serve`'s
    /// `POST /orgs/{org}/effects/{key}/resolve`, `idem resolve --via`) instead of claiming
    /// the org, which would fence the server.
    ///
    /// # Errors
    /// [`Error::Idem`] with `EffectInProgress` (a reservation still live, e.g. its executor
    /// running here: nothing written), `EffectNotAmbiguous`, `EffectResultTooLarge`,
    /// `EffectLost`; otherwise as [`Org::applied`].
    pub async fn resolve(
        &self,
        key: &str,
        resolution: Resolution,
        by: &str,
    ) -> Result<Effect, Error> {
        let opts = self.inner().effects.options(effect::Options::new());
        let (key, by) = (key.to_owned(), by.to_owned());
        let Answer {
            value: row,
            commit_seq,
        } = self
            .effect_job(|reply| Work::Resolve {
                key,
                resolution,
                by,
                opts,
                reply,
            })
            .await?;
        self.wait_shipped(commit_seq).await?;
        Ok(row)
    }

    /// The label this handle's reservations carry as holder: writer id, process instance and
    /// round (unique per handle).
    pub fn effect_holder(&self) -> &str {
        &self.inner().effects.label
    }

    /// Runs one effect job of this handle on its writer (`work` gets the reply channel).
    pub(crate) async fn effect_job<T>(
        &self,
        work: impl FnOnce(Reply<T>) -> Work,
    ) -> Result<Answer<T>, Error> {
        let holder = self.inner().effects.clone();
        self.call(|reply| {
            Job::Effect(EffectJob {
                holder,
                work: work(reply),
            })
        })
        .await
    }

    async fn read_effects(
        &self,
        key: Option<String>,
        state: Option<State>,
    ) -> Result<Vec<Effect>, Error> {
        let opts = self.inner().effects.options(effect::Options::new());
        let Answer {
            value: rows,
            commit_seq,
        } = self
            .effect_job(|reply| Work::Read {
                key,
                state,
                opts,
                reply,
            })
            .await?;
        self.wait_confirmed(commit_seq).await?;
        Ok(rows)
    }
}
