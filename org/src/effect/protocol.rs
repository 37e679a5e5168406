//! Reserve → execute → settle as one task the caller only awaits: a caller that gives up (a
//! timeout, `select!`, a client that disconnects) drops its wait, never the protocol.
//!
//! ```text
//! caller ──spawn──► task: take the key (after a protocol of the same key running here)
//!   │                 ─► writer: reserve ─► wait_shipped ─┐ not shipped: settle FAILED (it
//!   │                                                     │ never ran), report the error
//!   │                 ┌───────────────────────────────────┘
//!   │                 └─► executor (its own task / blocking thread; no transaction open)
//!   │                     ─► writer: settle ─► wait_shipped ─► answer
//!   └── awaits the answer (dropping the wait leaves the task running to the end)
//! ```
//! After an executor's `Ok`, every failure to record or acknowledge it is
//! [`Error::EffectUnacknowledged`], carrying the result, and is logged with it: the caller and
//! the operator both have what the executor returned.

use std::future::Future;
use std::pin::Pin;

use idem::BoxError;
use idem::effect::{self, Outcome, Reservation, Reserved, Settlement, State};

use crate::commit::Answer;
use crate::tenure::state::InFlight;
use crate::writer::job::Work;
use crate::{Error, Org};

type BoxFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, effect::Error>> + Send>>;

/// The caller's executor, either kind.
pub(crate) enum Executor {
    Async(Box<dyn FnOnce() -> BoxFuture + Send>),
    Blocking(Box<dyn FnOnce() -> Result<Vec<u8>, effect::Error> + Send>),
}

/// Runs the whole protocol for `key` (spawned by [`Org::effect`]).
pub(crate) async fn run(
    org: Org,
    key: String,
    opts: effect::Options,
    executor: Executor,
) -> Result<Outcome, Error> {
    let span = tracing::info_span!(
        "effect",
        org = %org.id(),
        round = org.round(),
        key = %crate::metrics::key_hash(&key),
    );
    tracing::Instrument::instrument(protocol(org, key, opts, executor), span).await
}

async fn protocol(
    org: Org,
    key: String,
    opts: effect::Options,
    executor: Executor,
) -> Result<Outcome, Error> {
    let holder = org.inner().effects.clone();
    // While it runs the org is in use: never evicted or parked under its executor.
    let _busy = InFlight::new(org.inner());
    let guard = holder.enter(&key).await;
    let attempt = match opts.fixed_attempt_id() {
        Some(id) => id,
        None => random_attempt().map_err(|e| Error::from_idem(org.id(), e))?,
    };
    guard.attempt(&attempt);
    let opts = holder.options(opts.attempt_id(attempt));
    let reservation = match reserve(&org, &key, &opts).await? {
        Ok(r) => r,
        Err(replay) => return Ok(replay),
    };
    guard.reserved_until(reservation.lease_until_ms());
    let (settlement, not_executed) = execute(executor).await;
    settle(&org, &key, reservation, settlement, not_executed, opts).await
}

/// Reserves and waits for the ship; `Ok(Err(outcome))` is a replay. A reservation that landed
/// but was not acknowledged never runs its executor, and says so (FAILED), so a retry runs it
/// instead of finding it AMBIGUOUS.
async fn reserve(
    org: &Org,
    key: &str,
    opts: &effect::Options,
) -> Result<Result<Reservation, Outcome>, Error> {
    let (key_owned, opts_owned) = (key.to_owned(), opts.clone());
    let Answer {
        value: reserved,
        commit_seq,
    } = org
        .effect_job(|reply| Work::Reserve {
            key: key_owned,
            opts: opts_owned,
            reply,
        })
        .await?;
    match reserved {
        // The reservation is durable in the store before the executor runs (E1 with I6).
        Reserved::Reservation(r) => match org.wait_shipped(commit_seq).await {
            Ok(()) => Ok(Ok(r)),
            Err(e) => {
                let why = format!(
                    "its reservation was not acknowledged: {}",
                    idem_base::ErrorChain::new(&e)
                );
                let settled =
                    write_settlement(org, r, Settlement::NotExecuted(why), opts.clone()).await;
                if let Err(s) = settled {
                    tracing::debug!(error = %idem_base::ErrorChain::new(&s), "could not record an unexecuted reservation");
                }
                Err(e)
            }
        },
        // A replay also needs a confirmation that this writer still owns the org.
        Reserved::Replay(row) => {
            org.wait_confirmed(commit_seq).await?;
            Ok(Err(Outcome {
                key: key.to_owned(),
                result: row.result.unwrap_or_default(),
                executed: false,
            }))
        }
    }
}

/// Runs the executor to its end; a panic is caught and becomes AMBIGUOUS.
async fn execute(executor: Executor) -> (Settlement, Option<BoxError>) {
    let ran = match executor {
        Executor::Async(f) => tokio::spawn(async move { f().await }).await,
        Executor::Blocking(f) => tokio::task::spawn_blocking(f).await,
    };
    match ran {
        Ok(Ok(result)) => (Settlement::Executed(result), None),
        Ok(Err(e)) => {
            let settlement = e.settlement();
            match e {
                effect::Error::NotExecuted(source) => (settlement, Some(source)),
                effect::Error::Ambiguous(_) => (settlement, None),
            }
        }
        Err(join) => {
            let text = if join.is_panic() {
                let panic = join.into_panic();
                let text = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                format!("executor panicked: {text}")
            } else {
                format!("executor {join}")
            };
            (Settlement::Ambiguous(text), None)
        }
    }
}

/// Records the settlement on the writer and returns the row and the commit to see shipped.
async fn write_settlement(
    org: &Org,
    reservation: Reservation,
    settlement: Settlement,
    opts: effect::Options,
) -> Result<Answer<effect::Effect>, Error> {
    org.effect_job(|reply| Work::Settle {
        reservation: Box::new(reservation),
        settlement,
        opts,
        reply,
    })
    .await
}

async fn settle(
    org: &Org,
    key: &str,
    reservation: Reservation,
    settlement: Settlement,
    not_executed: Option<BoxError>,
    opts: effect::Options,
) -> Result<Outcome, Error> {
    let executed = match &settlement {
        Settlement::Executed(result) => Some(result.clone()),
        _ => None,
    };
    let attempt = reservation.effect().attempt_hex();
    let acknowledged = match write_settlement(org, reservation, settlement, opts).await {
        Ok(Answer {
            value: row,
            commit_seq,
        }) => org.wait_shipped(commit_seq).await.map(|()| row),
        Err(e) => Err(e),
    };
    let row = match (acknowledged, executed) {
        (Ok(row), _) => row,
        // Recorded as executed (and confirmed, like every refusal): its result was not kept.
        (Err(e @ Error::Idem { .. }), Some(_))
            if matches!(e.idem(), Some(idem::Error::EffectResultNotKept { .. })) =>
        {
            return Err(e);
        }
        (Err(e), Some(result)) => return Err(unacknowledged(org, key, &attempt, result, e)),
        (Err(e), None) => return Err(e),
    };
    let state = match row.state {
        State::Committed => "committed",
        State::Failed => "failed",
        _ => "ambiguous",
    };
    metrics::counter!(crate::metrics::EFFECTS, "state" => state).increment(1);
    match (row.state, not_executed) {
        (State::Committed, _) => Ok(Outcome {
            key: key.to_owned(),
            result: row.result.unwrap_or_default(),
            executed: true,
        }),
        (State::Failed, Some(source)) => Err(Error::from_idem(
            org.id(),
            idem::Error::EffectNotExecuted {
                key: key.to_owned(),
                source,
            },
        )),
        _ => Err(Error::from_idem(
            org.id(),
            idem::Error::EffectAmbiguous {
                key: key.to_owned(),
                reason: row.error.unwrap_or_default(),
            },
        )),
    }
}

/// An executor's `Ok` whose settlement is not acknowledged: logged with its result (so an
/// operator can resolve the key with it) and returned carrying it.
fn unacknowledged(org: &Org, key: &str, attempt: &str, result: Vec<u8>, e: Error) -> Error {
    // The settlement's own error is the cause; its result travels in the new error.
    let source = match e {
        Error::Idem { org, source } => match *source {
            idem::Error::EffectNotRecorded { source, .. } => Error::from_idem(&org, *source),
            other => Error::from_idem(&org, other),
        },
        other => other,
    };
    tracing::warn!(
        org = %org.id(),
        round = org.round(),
        key,
        attempt,
        bytes = result.len(),
        result = %shown(&result),
        error = %idem_base::ErrorChain::new(&source),
        "effect executed but its settlement is not acknowledged: resolve the key with this result"
    );
    Error::EffectUnacknowledged {
        org: org.id().clone(),
        key: key.to_owned(),
        result: effect::Output::new(result),
        source: Box::new(source),
    }
}

/// A result for a log line: its text when it is UTF-8, else hex; at most 4 KiB of it.
fn shown(result: &[u8]) -> String {
    const MAX: usize = 4096;
    let head = &result[..result.len().min(MAX)];
    let more = if result.len() > MAX {
        " …(truncated)"
    } else {
        ""
    };
    match std::str::from_utf8(head) {
        Ok(text) => format!("{text}{more}"),
        Err(_) => format!("hex:{}{more}", hex::encode(head)),
    }
}

/// A fresh attempt id, drawn here so the running protocol is known by it before it reserves.
fn random_attempt() -> Result<[u8; 16], idem::Error> {
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| idem::Error::Random {
        reason: e.to_string(),
    })?;
    Ok(id)
}
