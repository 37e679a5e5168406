//! One acquired org: the request API over its writer and its acknowledgements.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, UNIX_EPOCH};

use idem::{BoxError, Options, Outcome, Record};
use idem_replica::OrgId;
use rusqlite::{Connection, Transaction};
use tokio::sync::oneshot;

use crate::ack::Stop;
use crate::commit::Answer;
use crate::tenure::state::{InFlight, Inner, TICK};
use crate::writer::{ApplyFn, Job, ReadFn, Refused};
use crate::{Error, ErrorKind};

/// A handle on an acquired org: this process is its one writer for one round. Cheap to clone.
///
/// Every method that returns `Ok` for a request does so only after a snapshot holding the
/// request's commit is published under this round (I6). After [`Error::Fenced`] or
/// [`Error::Closed`] the handle refuses everything: acquire the org again.
#[derive(Clone)]
pub struct Org {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Org {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Org")
            .field("org", &self.inner.acks.org)
            .field("round", &self.inner.acks.round)
            .finish()
    }
}

/// Shipping statistics of one org handle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrgStats {
    /// The writer's round.
    pub round: u64,
    /// Commit counter of the last local commit.
    pub committed: u64,
    /// Commit counter covered by the last published snapshot.
    pub shipped: u64,
    /// Snapshots and deltas published by this handle.
    pub ships: u64,
    /// Full snapshots among them (the rest are deltas).
    pub full_ships: u64,
    /// Compressed bytes of those full snapshots (part of `bytes_shipped`).
    pub full_bytes: u64,
    /// Compacted deltas among the ships (each supersedes the deltas before it).
    pub compactions: u64,
    /// Ships that failed (other than fenced).
    pub ship_failures: u64,
    /// Compressed bytes uploaded by this handle's ships (blobs; log entries not counted).
    pub bytes_shipped: u64,
    /// Requests acknowledged after waiting for a ship.
    pub acks: u64,
    /// Times the org was parked (connection closed while idle, claim kept).
    pub parks: u64,
    /// Times a parked org was reopened, its file proven to be the chain's tip.
    pub unparks: u64,
}

impl Org {
    pub(crate) fn from_inner(inner: Arc<Inner>) -> Org {
        Org { inner }
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// The org id.
    pub fn id(&self) -> &OrgId {
        &self.inner.acks.org
    }

    /// This writer's round (fencing epoch).
    pub fn round(&self) -> u64 {
        self.inner.acks.round
    }

    /// True until the handle is fenced or closed.
    pub fn is_serving(&self) -> bool {
        self.inner.acks.lock().stop.is_none() && self.inner.writer.accepting()
    }

    /// Shipping statistics of this handle.
    pub fn stats(&self) -> OrgStats {
        let c = &self.inner.acks.counters;
        OrgStats {
            round: self.round(),
            committed: self.inner.acks.commit_seq.get(),
            shipped: self.inner.acks.lock().shipped,
            ships: c.ships.load(Ordering::Relaxed),
            full_ships: c.full_ships.load(Ordering::Relaxed),
            full_bytes: c.full_bytes.load(Ordering::Relaxed),
            compactions: c.compactions.load(Ordering::Relaxed),
            ship_failures: c.ship_failures.load(Ordering::Relaxed),
            bytes_shipped: c.bytes_shipped.load(Ordering::Relaxed),
            acks: c.acks.load(Ordering::Relaxed),
            parks: c.parks.load(Ordering::Relaxed),
            unparks: c.unparks.load(Ordering::Relaxed),
        }
    }

    /// Requests on this handle: queued or running on the writer, or waiting for the ship or
    /// confirmation that acknowledges them. An org with any is never evicted or parked.
    pub(crate) fn inflight(&self) -> usize {
        self.inner.busy()
    }

    /// True while the org is parked: open and claimed, but its connection closed until its
    /// next request (docs/design.md, section 3c).
    pub fn is_parked(&self) -> bool {
        self.inner.writer.parked()
    }

    /// Waits until this handle's writer is closed and its files discarded: a release in
    /// progress (an eviction, a shutdown) has published its final ship and Release entry.
    pub(crate) async fn wait_closed(&self) {
        let mut closed = self.inner.closed.subscribe();
        let _ = closed.wait_for(|c| *c).await;
    }

    pub(crate) fn last_used(&self) -> u64 {
        self.inner.last_used.load(Ordering::Relaxed)
    }

    /// [`Org::once_with`] with default options.
    ///
    /// # Errors
    /// See [`Org::once_with`].
    pub async fn once<F, E>(&self, key: &str, apply: F) -> Result<Outcome, Error>
    where
        F: FnOnce(&Transaction<'_>) -> Result<Vec<u8>, E> + Send + 'static,
        E: Into<BoxError>,
    {
        self.once_with(key, Options::new(), apply).await
    }

    /// Runs `idem::once_with` for `key` with this org's round on the org's writer connection
    /// (a dedicated thread, off the async runtime), then returns only once a snapshot holding
    /// the commit is published (I6). A replay also waits for the ship of every commit made so
    /// far, so a key committed but not yet shipped is never acknowledged early.
    ///
    /// # Errors
    /// [`Error::Idem`] from the dedup transaction (its kind tells retry / rejected / input);
    /// [`Error::ShipFailed`] (retryable: the commit stays local until a later ship);
    /// [`Error::Fenced`] / [`Error::Closed`] / [`Error::WriterGone`]: acquire again.
    pub async fn once_with<F, E>(
        &self,
        key: &str,
        opts: Options,
        apply: F,
    ) -> Result<Outcome, Error>
    where
        F: FnOnce(&Transaction<'_>) -> Result<Vec<u8>, E> + Send + 'static,
        E: Into<BoxError>,
    {
        let span = tracing::info_span!(
            "request",
            org = %self.inner.acks.org,
            round = self.inner.acks.round,
            key = %crate::metrics::key_hash(key),
        );
        tracing::Instrument::instrument(self.once_traced(key, opts, apply), span).await
    }

    async fn once_traced<F, E>(&self, key: &str, opts: Options, apply: F) -> Result<Outcome, Error>
    where
        F: FnOnce(&Transaction<'_>) -> Result<Vec<u8>, E> + Send + 'static,
        E: Into<BoxError>,
    {
        let began = idem_base::Stopwatch::start();
        let apply: ApplyFn = Box::new(move |tx| apply(tx).map_err(Into::into));
        let Answer {
            value: out,
            commit_seq,
        } = self
            .call(|reply| Job::Once {
                key: key.to_owned(),
                opts,
                apply,
                reply,
            })
            .await?;
        let outcome = if out.applied {
            self.inner.acks.wait_shipped(commit_seq).await?;
            "applied"
        } else {
            self.inner.acks.wait_confirmed(commit_seq).await?;
            "replayed"
        };
        metrics::histogram!(crate::metrics::ACK_SECONDS, "outcome" => outcome)
            .record(crate::metrics::seconds(began.elapsed()));
        Ok(out)
    }

    /// The stored record of `key`, once every commit so far is shipped (so a record returned
    /// here is durable in the store).
    ///
    /// # Errors
    /// As [`Org::once_with`].
    pub async fn applied(&self, key: &str) -> Result<Option<Record>, Error> {
        let Answer {
            value: rec,
            commit_seq,
        } = self
            .call(|reply| Job::Applied {
                key: key.to_owned(),
                reply,
            })
            .await?;
        self.inner.acks.wait_confirmed(commit_seq).await?;
        Ok(rec)
    }

    /// Runs `read` on the org's writer connection, inside a transaction that is rolled back
    /// afterwards (nothing it writes stays), and returns its result only once every commit
    /// it could see is shipped and a confirmation that started after this call found no
    /// successor (I6, I7): a read never reveals a state the store does not hold.
    ///
    /// This is how an application reads an org's data while it is served: the writer holds
    /// the database file exclusively (I13), so other connections get "database is locked".
    ///
    /// # Errors
    /// [`Error::Read`] when `read` fails or panics — once confirmed like a result, since a
    /// failure ("no such row") depends on the data too; otherwise as [`Org::once_with`].
    pub async fn read<T, F>(&self, read: F) -> Result<T, Error>
    where
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.read_mut(move |conn| {
            let tx = conn.transaction()?;
            // Reading first holds the read snapshot, so a checkpoint the closure attempts
            // fails as locked instead of rewriting the database file behind the writer.
            crate::commit::read(&tx)?;
            read(&tx)
        })
        .await
    }

    pub(crate) async fn read_mut<T, F>(&self, read: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: ReadFn = Box::new(move |conn| {
            let _ = tx.send(read(conn));
        });
        let seen = self.call(|reply| Job::Read { read: job, reply }).await?;
        let org = self.inner.acks.org.clone();
        let out = match rx.await {
            Ok(Ok(v)) => Ok(v),
            // A read's error ("no such row") depends on the data as much as its result.
            Ok(Err(source)) => Err(Error::Read {
                org,
                source: source.into(),
            }),
            Err(_) => Err(Error::Read {
                org,
                source: "the read panicked".into(),
            }),
        };
        self.inner.acks.wait_confirmed(seen.commit_seq).await?;
        out
    }

    /// Deletes keys applied more than `window` ago, then ships, and returns how many were
    /// deleted. "Ago" is by the earlier of this host's clock (the replica's) and the store's,
    /// read after the check below: a key younger than `window` by either clock stays.
    ///
    /// Never on a clock the store contradicts (I15): first this host's clock is checked
    /// against the store's ([`idem_replica::Replica::store_time`]: the Last-Modified of an
    /// object this process wrote, usually one HEAD per minute for the whole process, often
    /// none), and prune is refused past `idem_replica::Settings::max_clock_skew_ms`. The
    /// cutoff is computed here from that same reading, never by the caller beforehand: a
    /// cutoff taken from a host clock that then stepped back into the bound would delete
    /// keys younger than the window.
    ///
    /// # Errors
    /// [`Error::Replica`] with `idem_replica::Error::ClockSkew` (kind `Fatal`; nothing deleted)
    /// when the clocks disagree beyond the bound, or with the store's error when its clock
    /// cannot be read; otherwise as [`Org::once_with`].
    pub async fn prune(&self, window: Duration) -> Result<u64, Error> {
        let store = self
            .inner
            .replica
            .store_time("prune")
            .await
            .map_err(|e| Error::replica(&self.inner.acks.org, e))?;
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        // A window reaching before the Unix epoch prunes nothing.
        let cutoff = UNIX_EPOCH + Duration::from_millis(store.now_ms().saturating_sub(window_ms));
        let pruned = self.call(|reply| Job::Prune { cutoff, reply }).await?;
        self.inner.acks.wait_shipped(pruned.commit_seq).await?;
        Ok(pruned.value)
    }

    /// Rebuilds the database file with `VACUUM` on the writer connection (reclaiming the
    /// space `prune` freed), then returns once the result is shipped. VACUUM rewrites every
    /// page, so the ship after it is as large as the database.
    ///
    /// # Errors
    /// As [`Org::once_with`].
    pub async fn vacuum(&self) -> Result<(), Error> {
        let done = self.call(|reply| Job::Vacuum { reply }).await?;
        self.inner.acks.wait_shipped(done.commit_seq).await
    }

    /// Makes the org's next ship a full snapshot whatever its `ShipPolicy` says; it ships
    /// with the next request that commits. For a fresh base after a bulk load, and for
    /// benchmarks that measure what a full snapshot uploads.
    pub async fn full_snapshot_next(&self) {
        self.inner.publishing().await.full_next();
    }

    /// Waits until a ship covering commit `commit_seq` is published (I6).
    pub(crate) async fn wait_shipped(&self, commit_seq: u64) -> Result<(), Error> {
        self.inner.acks.wait_shipped(commit_seq).await
    }

    /// Waits for commit `commit_seq` to be shipped and for a confirmation that started after
    /// this call (replays and reads).
    pub(crate) async fn wait_confirmed(&self, commit_seq: u64) -> Result<(), Error> {
        self.inner.acks.wait_confirmed(commit_seq).await
    }

    pub(crate) async fn call<T>(
        &self,
        job: impl FnOnce(crate::writer::Reply<T>) -> Job,
    ) -> Result<Answer<T>, Error> {
        let inner = &self.inner;
        let _guard = InFlight::new(inner);
        inner
            .last_used
            .store(TICK.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        let stopped = inner.acks.lock().stop.clone();
        if let Some(stop) = stopped {
            return Err(inner.acks.stop_error(stop));
        }
        let (tx, rx) = oneshot::channel();
        let mut job = job(tx);
        let mut unparked = false;
        loop {
            match inner.writer.request(job) {
                Ok(()) => break,
                Err(Refused::Closed) => return Err(inner.acks.stop_error(Stop::Closed)),
                // Parked: reopen and prove the file first (or wait for a park in progress,
                // then do so); nothing runs on it before (I8, I13).
                Err(Refused::Parked(back)) => {
                    job = *back;
                    unparked |= crate::park::unpark(inner).await?;
                }
            }
        }
        if unparked {
            // While the job runs: park others beyond the registry's active-org limit.
            crate::park::enforce(&inner.active, inner.serial).await;
        }
        let org = inner.acks.org.clone();
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => {
                let refused = Error::from_idem(&org, source);
                // A refusal decided from the database (a fingerprint mismatch, exhausted
                // attempts, an `apply` that failed on what it read, an effect in the wrong
                // state) is an answer too: it waits for the same confirmation as a replay,
                // so it never reveals a commit the store does not hold (I6, I7). Until then
                // the caller gets the confirmation's retryable or fenced error instead. Only
                // bad input, decided without reading anything, is answered at once.
                if refused.kind() != ErrorKind::Input {
                    let seen = inner.acks.commit_seq.get();
                    inner.acks.wait_confirmed(seen).await?;
                }
                Err(refused)
            }
            Err(_) => Err(Error::WriterGone { org }),
        }
    }
}
