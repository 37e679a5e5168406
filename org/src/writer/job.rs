//! Effect work on the org's writer thread: each job runs one `idem::effect` call on the writer
//! connection and answers with the commit sequence the caller must see shipped.

use std::sync::Arc;

use idem::effect::{
    self, Effect, Reservation, Reserved, Resolution, Settlement, State, Transition,
};
use rusqlite::Connection;

use crate::commit::{self, Answer, CommitSeq};
use crate::effect::Holder;
use crate::sync::lock;
use crate::writer::Reply;

/// Effect work for the org's writer thread, for the handle `holder`.
pub(crate) struct EffectJob {
    pub(crate) holder: Arc<Holder>,
    pub(crate) work: Work,
}

/// What an [`EffectJob`] does. Every `opts` is the handle's ([`Holder::options`]): its holder
/// label, lapse rule, clock and commit-counter bump.
pub(crate) enum Work {
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
        opts: effect::Options,
        reply: Reply<Effect>,
    },
    /// Rows as the handle judges them (a lapsed reservation reads AMBIGUOUS).
    Read {
        key: Option<String>,
        state: Option<State>,
        opts: effect::Options,
        reply: Reply<Vec<Effect>>,
    },
    History {
        key: String,
        reply: Reply<Vec<Transition>>,
    },
    /// Reloads the open rows the gauge counts (`Holder::open_counts`).
    Tally { reply: Reply<()> },
}

/// Runs one effect job on the writer connection. The reply carries the commit sequence the
/// caller must see shipped: every commit so far (the writer thread is the only writer, so this
/// covers the job's own transition and, for a replay, the commit that settled the key). It is
/// raised before every reply, an error's included: a transition may commit and then refuse
/// (a lapsed reservation turned AMBIGUOUS, a result recorded without being kept). After every
/// write the open rows the gauge counts are reloaded (an index read of the open rows only).
pub(crate) fn run_job(conn: &mut Connection, seq: &CommitSeq, job: EffectJob) {
    fn answered<T>(
        conn: &Connection,
        seq: &CommitSeq,
        out: Result<T, idem::Error>,
    ) -> Result<Answer<T>, idem::Error> {
        let commit_seq = seq.raise(commit::read(conn).unwrap_or(0));
        out.map(|value| Answer { value, commit_seq })
    }
    let EffectJob { holder, work } = job;
    let wrote = matches!(
        work,
        Work::Reserve { .. } | Work::Settle { .. } | Work::Resolve { .. }
    );
    match work {
        Work::Reserve { key, opts, reply } => {
            let out = effect::reserve(conn, &key, &opts);
            refresh(conn, &holder, wrote);
            let _ = reply.send(answered(conn, seq, out));
        }
        Work::Settle {
            reservation,
            settlement,
            opts,
            reply,
        } => {
            let out = effect::settle(conn, &reservation, settlement, &opts);
            refresh(conn, &holder, wrote);
            let _ = reply.send(answered(conn, seq, out));
        }
        Work::Resolve {
            key,
            resolution,
            by,
            opts,
            reply,
        } => {
            let at = opts.now();
            let out = effect::resolve_with(conn, &key, resolution, &by, at, &opts);
            refresh(conn, &holder, wrote);
            let _ = reply.send(answered(conn, seq, out));
        }
        Work::Read {
            key,
            state,
            opts,
            reply,
        } => {
            let out = match key {
                Some(k) => effect::get_with(conn, &k, &opts).map(|r| r.into_iter().collect()),
                None => effect::list_with(conn, state, &opts),
            };
            let _ = reply.send(answered(conn, seq, out));
        }
        Work::History { key, reply } => {
            let out = effect::history(conn, &key);
            let _ = reply.send(answered(conn, seq, out));
        }
        Work::Tally { reply } => {
            let out = tally(conn, &holder);
            let _ = reply.send(answered(conn, seq, out));
        }
    }
}

/// After a write: reloads the open rows, logging (never failing the job) when it cannot.
fn refresh(conn: &Connection, holder: &Holder, wrote: bool) {
    if wrote && let Err(e) = tally(conn, holder) {
        tracing::warn!(error = %e, "could not reload the open effects the gauge counts");
    }
}

/// Reloads `holder`'s open rows from the database (RESERVED and AMBIGUOUS, as stored).
pub(crate) fn tally(conn: &Connection, holder: &Holder) -> Result<(), idem::Error> {
    let mut open = effect::list(conn, Some(State::Reserved))?;
    open.extend(effect::list(conn, Some(State::Ambiguous))?);
    *lock(&holder.open) = open;
    Ok(())
}
