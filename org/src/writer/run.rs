//! Running every writer job ([`super::job`]) on its connection: one job at a time, each settling the commit
//! sequence before it replies (I6); parking closes the connection and unparking reopens it
//! the way it was opened.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use idem::effect::{self, WriteHook};
use idem_replica::sqlite::{self, CaptureError, Owned, OwnedFiles, ReopenError};
use rusqlite::Connection;

use crate::commit::{self, Answer, CommitSeq};

use super::job::{EffectJob, Job, ParkRefused, Work};
use super::{Reopen, Runner, WriterCtx, prepare};
use crate::effect::holder::Holder;
use crate::sync::lock;

impl Reopen {
    /// Reopens the closed database ([`sqlite::reopen_exclusive`]: never creates it, refuses
    /// a WAL someone else left) and configures the connection as [`super::open`] does.
    fn open(&self) -> Result<Owned, String> {
        let conn = sqlite::reopen_exclusive(&self.path, self.busy, self.durability).map_err(
            |e| match e {
                ReopenError::Foreign(f) => f.to_string(),
                e => idem_base::ErrorChain::every(&e).to_string(),
            },
        )?;
        prepare(
            conn,
            &self.path,
            self.busy,
            self.cache_kib,
            self.init.as_ref(),
        )
        .map_err(|e| format!("reopening the writer: {e:?}"))
    }
}

/// After a job: when it committed something without raising the sequence (a prune, which
/// takes no write hook; a failed attempt whose hook failed), commits one bump, so that state
/// ships before any answer that read it; then raises `seq` to the database's, before the job's
/// reply. `total_changes` also counts rolled-back writes, so this may bump once too often — a
/// page more in a ship, never a commit missed. Returns the sequence the reply carries: every
/// commit so far.
fn settle(conn: &mut Connection, seq: &CommitSeq, changes_before: u64, seq_before: u64) -> u64 {
    let now = commit::read(conn).unwrap_or(0);
    if conn.total_changes() != changes_before && now <= seq_before {
        let bumped = conn.transaction().and_then(|tx| {
            let n = commit::bump(&tx)?;
            tx.commit()?;
            Ok(n)
        });
        match bumped {
            Ok(n) => {
                seq.raise(n);
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not raise the commit sequence after a write")
            }
        }
    }
    seq.raise(now)
}

/// The one way a job's transaction raises the commit sequence: idem's write hook, run inside
/// the dedup transaction or the effect transition just before its COMMIT, so the bump commits
/// with the write it covers (I6). Set here, by the writer that owns the sequence, on every
/// `once` and effect call's options.
fn bump_hook() -> WriteHook {
    Arc::new(|conn| commit::bump(conn).map(|_| ()))
}

fn answer<T>(out: Result<T, idem::Error>, commit_seq: u64) -> Result<Answer<T>, idem::Error> {
    out.map(|value| Answer { value, commit_seq })
}

impl Runner {
    /// Runs one job and sends its reply: parking and unparking change the connection; every
    /// other job runs on it (a request never reaches a parked writer: `Writer::request`
    /// hands it back; a capture there fails as I/O).
    pub(super) fn run(&mut self, job: Job) {
        match job {
            Job::Park { shipped, reply } => {
                let _ = reply.send(self.park(shipped));
            }
            Job::Unpark { reply } => {
                let _ = reply.send(self.unpark());
            }
            Job::Drain { reply } => {
                let _ = reply.send(());
            }
            Job::Capture { reply, .. } if self.owned.is_none() => {
                let _ = reply.send(Err(CaptureError::Io(std::io::Error::other(
                    "the writer is parked",
                ))));
            }
            job => match self.owned.as_mut() {
                Some(owned) => run_on(owned, &self.ctx, job),
                // Dropped: its reply sender tells the caller the writer is gone.
                None => drop(job),
            },
        }
    }

    /// Checkpoints and closes the connection when the database still holds `shipped`.
    fn park(&mut self, shipped: u64) -> Result<(), ParkRefused> {
        let Some(owned) = self.owned.as_mut() else {
            return Ok(());
        };
        let now = commit::read(&owned.conn).map_err(|e| ParkRefused::Busy(e.to_string()))?;
        if now != shipped || self.ctx.commit_seq.get() != shipped {
            return Err(ParkRefused::Busy(format!(
                "commit {now} is not the shipped {shipped}"
            )));
        }
        owned.checkpoint_to_file().map_err(|e| match e {
            CaptureError::Foreign(f) => ParkRefused::Foreign(f.to_string()),
            CaptureError::Io(e) => ParkRefused::Busy(e.to_string()),
        })?;
        // The connection closes before the descriptors it owns (I13).
        self.owned = None;
        Ok(())
    }

    /// Reopens the connection of a parked writer.
    fn unpark(&mut self) -> Result<Arc<OwnedFiles>, String> {
        if let Some(owned) = &self.owned {
            return Ok(owned.files().clone());
        }
        let owned = self.ctx.reopen.open()?;
        let files = owned.files().clone();
        self.owned = Some(owned);
        Ok(files)
    }
}

/// Runs one job on the open connection and sends its reply.
fn run_on(owned: &mut Owned, ctx: &WriterCtx, job: Job) {
    let (round, seq, clock) = (ctx.round, &*ctx.commit_seq, &ctx.clock);
    // Where the job starts: SQLite's count of changed rows and the sequence (equal to the
    // database's between jobs: every job that moves it raises `seq` before it replies).
    let (changes, before) = (owned.conn.total_changes(), seq.get());
    let conn = &mut owned.conn;
    match job {
        Job::Once {
            key,
            opts,
            apply,
            reply,
        } => {
            let opts = opts.clock(clock.clone()).on_write(bump_hook());
            // A panic in apply rolls its transaction back (the Transaction is dropped while
            // unwinding); catching it keeps the org's writer alive for other requests.
            let out = catch_unwind(AssertUnwindSafe(|| {
                idem::once_with(conn, &key, round, &opts, apply)
            }))
            .unwrap_or_else(|_| {
                Err(idem::Error::Apply {
                    key: key.clone(),
                    source: "apply panicked".into(),
                })
            });
            // Every answer waits for every commit so far: a replay's or a refusal's key
            // row is among them.
            let _ = reply.send(answer(out, settle(conn, seq, changes, before)));
        }
        Job::Applied { key, reply } => {
            let _ = reply.send(answer(idem::applied(conn, &key), seq.get()));
        }
        Job::Prune { cutoff, reply } => {
            let out = idem::prune(conn, cutoff);
            let _ = reply.send(answer(out, settle(conn, seq, changes, before)));
        }
        Job::Vacuum { reply } => {
            let out = conn
                .execute_batch("VACUUM")
                .and_then(|()| {
                    let tx = conn.transaction()?;
                    let n = commit::bump(&tx)?;
                    tx.commit()?;
                    Ok(seq.raise(n))
                })
                .map(|n| Answer {
                    value: (),
                    commit_seq: n,
                })
                .map_err(idem::Error::from);
            let _ = reply.send(out);
        }
        Job::Effect(job) => run_effect(conn, seq, job),
        Job::Capture { request, reply } => {
            // The capture labels what the pages hold with the database's own sequence (it
            // reads the counter from the connection), and the shipper checks the pages agree.
            let out = owned.capture(request);
            if let Ok(captured) = &out {
                seq.raise(captured.commit());
            }
            let _ = reply.send(out);
        }
        Job::Read { read, reply } => {
            let seen = seq.get();
            // A panic in the read drops its result sender: the caller sees it.
            let _ = catch_unwind(AssertUnwindSafe(|| read(conn)));
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            let _ = reply.send(answer(Ok(()), seen));
        }
        // Handled by `Runner::run`.
        Job::Drain { .. } | Job::Park { .. } | Job::Unpark { .. } => {}
    }
}

/// Runs one effect job on the writer connection. The reply carries the commit sequence the
/// caller must see shipped: every commit so far (the writer thread is the only writer, so this
/// covers the job's own transition and, for a replay, the commit that settled the key). It is
/// raised before every reply, an error's included: a transition may commit and then refuse
/// (a lapsed reservation turned AMBIGUOUS, a result recorded without being kept). After every
/// write the open rows the gauge counts are reloaded (an index read of the open rows only).
fn run_effect(conn: &mut Connection, seq: &CommitSeq, job: EffectJob) {
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
            let out = effect::reserve(conn, &key, &opts.on_write(bump_hook()));
            refresh(conn, &holder, wrote);
            let _ = reply.send(answered(conn, seq, out));
        }
        Work::Settle {
            reservation,
            settlement,
            opts,
            reply,
        } => {
            let opts = opts.on_write(bump_hook());
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
            let opts = opts.on_write(bump_hook());
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
    }
}

/// After a write: reloads the open rows, logging (never failing the job) when it cannot.
fn refresh(conn: &Connection, holder: &Holder, wrote: bool) {
    if wrote && let Err(e) = tally(conn, holder) {
        tracing::warn!(error = %e, "could not reload the open effects the gauge counts");
    }
}

/// Reloads `holder`'s open rows from the database (RESERVED and AMBIGUOUS, as stored).
fn tally(conn: &Connection, holder: &Holder) -> Result<(), idem::Error> {
    *lock(&holder.open) = effect::list_open(conn)?;
    Ok(())
}
