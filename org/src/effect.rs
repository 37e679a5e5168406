//! External effects on an acquired org: reserve → execute → settle, each write acknowledged
//! only after a ship (I6), so a handoff between reserve and execute cannot let a successor
//! execute again.
//!
//! ```text
//! caller ─► writer: reserve (bumps the commit counter in the same tx) ─► wait_shipped ─┐
//!   ┌──────────────────────────────────────────────────────────────────────────────────┘
//!   └─► executor (a task / blocking thread; no transaction open)
//!         ─► writer: settle (conditional UPDATE + counter bump) ─► wait_shipped ─► Ok
//! ```
//! A successor hydrates every acknowledged reservation, so it finds the key RESERVED by the old
//! writer's attempt (in progress) and, once the lease lapses, AMBIGUOUS — never free to run.

use std::sync::Arc;

use idem::effect::{self, Effect, Reservation, Reserved, Resolution, Settlement, State};
use rusqlite::Connection;

use crate::commit::{self, Answer, CommitSeq};
use crate::writer::{Job, Reply};
use crate::{Error, Org};

/// Effect work for the org's writer thread.
pub(crate) enum EffectJob {
    Reserve {
        key: String,
        opts: effect::Options,
        reply: Reply<Reserved>,
    },
    Settle {
        reservation: Box<Reservation>,
        settlement: Settlement,
        opts: effect::Options,
        reply: Reply<Effect>,
    },
    Resolve {
        key: String,
        resolution: Resolution,
        by: String,
        reply: Reply<Effect>,
    },
    Read {
        key: Option<String>,
        state: Option<State>,
        reply: Reply<Vec<Effect>>,
    },
}

fn bump(conn: &Connection) -> rusqlite::Result<()> {
    commit::bump(conn).map(|_| ())
}

/// Every effect write raises the commit sequence in its own transaction (the snapshot that holds
/// the counter value holds the transition); the registry clock stamps it unless one was set.
fn writer_opts(opts: effect::Options, clock: &Arc<dyn idem::Clock>) -> effect::Options {
    let opts = opts.on_write(Arc::new(bump));
    if opts.has_clock() {
        opts
    } else {
        opts.clock(clock.clone())
    }
}

/// Runs one effect job on the writer connection. The reply carries the commit sequence the
/// caller must see shipped: every commit so far (the writer thread is the only writer, so this
/// covers the job's own transition and, for a replay, the commit that settled the key). It is
/// raised before every reply, an error's included: a transition may commit and then refuse
/// (a lapsed reservation turned AMBIGUOUS).
pub(crate) fn run_job(
    conn: &mut Connection,
    seq: &CommitSeq,
    clock: &Arc<dyn idem::Clock>,
    job: EffectJob,
) {
    fn answered<T>(
        conn: &Connection,
        seq: &CommitSeq,
        out: Result<T, idem::Error>,
    ) -> Result<Answer<T>, idem::Error> {
        let commit_seq = seq.raise(commit::read(conn).unwrap_or(0));
        out.map(|value| Answer { value, commit_seq })
    }
    match job {
        EffectJob::Reserve { key, opts, reply } => {
            let out = effect::reserve(conn, &key, &writer_opts(opts, clock));
            let _ = reply.send(answered(conn, seq, out));
        }
        EffectJob::Settle {
            reservation,
            settlement,
            opts,
            reply,
        } => {
            let out = effect::settle(conn, &reservation, settlement, &writer_opts(opts, clock));
            let _ = reply.send(answered(conn, seq, out));
        }
        EffectJob::Resolve {
            key,
            resolution,
            by,
            reply,
        } => {
            let opts = writer_opts(effect::Options::new(), clock);
            let out = effect::resolve_with(conn, &key, resolution, &by, clock.now_ms(), &opts);
            let _ = reply.send(answered(conn, seq, out));
        }
        EffectJob::Read { key, state, reply } => {
            let out = match key {
                Some(k) => effect::get(conn, &k).map(|r| r.into_iter().collect()),
                None => effect::list(conn, state),
            };
            let _ = reply.send(answered(conn, seq, out));
        }
    }
}

impl Org {
    /// Runs an external effect (payment, email, webhook) at most once for `key` in the org's
    /// acknowledged history, across handoffs (E1 with I6): the reservation is shipped before
    /// `executor` starts, and the settlement is shipped before this returns `Ok`.
    ///
    /// `executor` runs as a tokio task with no transaction open. `Ok(bytes)` → COMMITTED and
    /// replayed to every later call; [`effect::Error::NotExecuted`] → FAILED (a later call runs
    /// it again); [`effect::Error::Ambiguous`], a panic or a cancellation → AMBIGUOUS.
    ///
    /// # Errors
    /// [`Error::Idem`] carrying `EffectInProgress` (retry later), `EffectAmbiguous` (needs
    /// [`Org::resolve`]), `EffectNotExecuted`, `EffectLost`, or the commit errors of
    /// `idem::effect::reserve` / `idem::effect::settle`; [`Error::ShipFailed`] (retry with the
    /// key: the reservation may be local only, or the settlement unacknowledged);
    /// [`Error::Fenced`] / [`Error::Closed`]: acquire again — if the executor already ran, the
    /// successor finds the key reserved and later AMBIGUOUS, never free to run again.
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
        let reservation = match self.reserve_effect(key, &opts).await? {
            Ok(r) => r,
            Err(replay) => return Ok(replay),
        };
        let ran = tokio::spawn(async move { executor().await }).await;
        self.settle_effect(key, reservation, ran, opts).await
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
        let reservation = match self.reserve_effect(key, &opts).await? {
            Ok(r) => r,
            Err(replay) => return Ok(replay),
        };
        let ran = tokio::task::spawn_blocking(executor).await;
        self.settle_effect(key, reservation, ran, opts).await
    }

    /// The stored effect row of `key`, once every commit so far is shipped.
    ///
    /// # Errors
    /// As [`Org::applied`].
    pub async fn effect_record(&self, key: &str) -> Result<Option<Effect>, Error> {
        let rows = self.read_effects(Some(key.to_owned()), None).await?;
        Ok(rows.into_iter().next())
    }

    /// Every effect row, or those in `state`, once every commit so far is shipped.
    ///
    /// # Errors
    /// As [`Org::applied`].
    pub async fn effects(&self, state: Option<State>) -> Result<Vec<Effect>, Error> {
        self.read_effects(None, state).await
    }

    /// Resolves an AMBIGUOUS effect (see `idem::effect::resolve`), stamped with the registry
    /// clock and acknowledged after a ship.
    ///
    /// # Errors
    /// [`Error::Idem`] with `EffectNotAmbiguous` / `EffectLost`; otherwise as [`Org::applied`].
    pub async fn resolve(
        &self,
        key: &str,
        resolution: Resolution,
        by: &str,
    ) -> Result<Effect, Error> {
        let Answer {
            value: row,
            commit_seq,
        } = self
            .call(|reply| {
                Job::Effect(EffectJob::Resolve {
                    key: key.to_owned(),
                    resolution,
                    by: by.to_owned(),
                    reply,
                })
            })
            .await?;
        self.wait_shipped(commit_seq).await?;
        Ok(row)
    }

    async fn read_effects(
        &self,
        key: Option<String>,
        state: Option<State>,
    ) -> Result<Vec<Effect>, Error> {
        let Answer {
            value: rows,
            commit_seq,
        } = self
            .call(|reply| Job::Effect(EffectJob::Read { key, state, reply }))
            .await?;
        self.wait_confirmed(commit_seq).await?;
        Ok(rows)
    }

    /// Reserves and waits for the ship; `Ok(Err(outcome))` is a replay.
    async fn reserve_effect(
        &self,
        key: &str,
        opts: &effect::Options,
    ) -> Result<Result<Reservation, effect::Outcome>, Error> {
        let Answer {
            value: reserved,
            commit_seq,
        } = self
            .call(|reply| {
                Job::Effect(EffectJob::Reserve {
                    key: key.to_owned(),
                    opts: opts.clone(),
                    reply,
                })
            })
            .await?;
        // The reservation (or, for a replay, the settlement) is durable in the store before
        // the executor runs (or the result is returned); a replay also needs a confirmation
        // that this writer still owns the org.
        match reserved {
            Reserved::Reservation(_) => self.wait_shipped(commit_seq).await?,
            Reserved::Replay(_) => self.wait_confirmed(commit_seq).await?,
        }
        Ok(match reserved {
            Reserved::Reservation(r) => Ok(r),
            Reserved::Replay(row) => Err(effect::Outcome {
                key: key.to_owned(),
                result: row.result.unwrap_or_default(),
                executed: false,
            }),
        })
    }

    async fn settle_effect(
        &self,
        key: &str,
        reservation: Reservation,
        ran: Result<Result<Vec<u8>, effect::Error>, tokio::task::JoinError>,
        opts: effect::Options,
    ) -> Result<effect::Outcome, Error> {
        let (settlement, not_executed) = match ran {
            Ok(Ok(result)) => (Settlement::Executed(result), None),
            Ok(Err(e)) => {
                let settlement = e.settlement();
                match e {
                    effect::Error::NotExecuted(source) => (settlement, Some(source)),
                    effect::Error::Ambiguous(_) => (settlement, None),
                }
            }
            Err(join) => (Settlement::Ambiguous(format!("executor {join}")), None),
        };
        let Answer {
            value: row,
            commit_seq,
        } = self
            .call(|reply| {
                Job::Effect(EffectJob::Settle {
                    reservation: Box::new(reservation),
                    settlement,
                    opts,
                    reply,
                })
            })
            .await?;
        self.wait_shipped(commit_seq).await?;
        let state = match row.state {
            State::Committed => "committed",
            State::Failed => "failed",
            _ => "ambiguous",
        };
        metrics::counter!(crate::metrics::EFFECTS, "state" => state).increment(1);
        match (row.state, not_executed) {
            (State::Committed, _) => Ok(effect::Outcome {
                key: key.to_owned(),
                result: row.result.unwrap_or_default(),
                executed: true,
            }),
            (State::Failed, Some(source)) => Err(Error::from_idem(
                self.id(),
                idem::Error::EffectNotExecuted {
                    key: key.to_owned(),
                    source,
                },
            )),
            _ => Err(Error::from_idem(
                self.id(),
                idem::Error::EffectAmbiguous {
                    key: key.to_owned(),
                    reason: row.error.unwrap_or_default(),
                },
            )),
        }
    }
}
