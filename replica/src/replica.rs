//! The fenced snapshot store: open (with the create-only probe), claim, ship, release,
//! and listing. Hydrate/restore/verify live in `hydrate.rs`, retention in `retention.rs`.

use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};
use tracing::{debug, info, warn};

use crate::claim::Tip;
use crate::delta::{Delta, PageHashes, checksum_hex};
use crate::entry::Lease;
use crate::layout::{Layout, blob_name, delta_blob_name, new_nonce, parse_log_name};
use crate::org_id::check_writer;
use crate::snapshot::{Packed, Snapshot, pack};
use crate::{
    Claim, Clock, Error, FailPoint, Failpoints, LogEntry, OrgId, Settings, Shipped, SystemClock,
};

/// Handle on a fenced snapshot store; cheap to clone.
#[derive(Clone, Debug)]
pub struct Replica {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) layout: Layout,
    pub(crate) settings: Settings,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) failpoints: Option<Arc<dyn Failpoints>>,
    /// This process's instance: written into every lease it holds, so a claim tells another
    /// live process with the same writer id from itself.
    pub(crate) instance: String,
    /// Opened with [`Replica::open_read_only`]: claims and retention are refused.
    pub(crate) read_only: bool,
}

/// The fields every snapshot and delta entry shares, filled in by `upload_and_publish`.
struct EntryCommon {
    seq: u64,
    round: u64,
    writer: String,
    nonce: String,
    at_ms: u64,
    blob: String,
    sha256: String,
    bytes: u64,
    compressed_bytes: u64,
}

/// Runs CPU-bound work (hashing, compression) on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    op: &'static str,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|source| Error::Task { op, source })?
}

/// Outcome of a create-only publish that did not fail.
pub(crate) enum Published {
    Landed,
    Taken(Box<LogEntry>),
}

impl Replica {
    /// A local-directory store rooted at `dir` (created if missing), built
    /// `with_fsync(true)` so an acknowledged object is on disk.
    ///
    /// # Errors
    /// [`Error::Io`] if the directory cannot be created; [`Error::Store`] if the store
    /// cannot be built on it.
    pub fn local_store(dir: &std::path::Path) -> Result<Arc<dyn ObjectStore>, Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
            .map_err(|source| Error::Store {
                op: "open",
                path: dir.display().to_string(),
                source,
            })?
            .with_fsync(true);
        Ok(Arc::new(store))
    }

    /// Opens over `store` under `prefix` ("" allowed) with the system clock and no failpoints.
    ///
    /// # Errors
    /// As [`Replica::open_with`].
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        settings: Settings,
    ) -> Result<Replica, Error> {
        Self::open_with(store, prefix, settings, Arc::new(SystemClock), None).await
    }

    /// Opens with an injected clock and optional failpoints.
    ///
    /// Probes the store once: two create-only puts on one fresh path under the prefix; the
    /// second must fail with `AlreadyExists`, else fencing would be unsound.
    ///
    /// # Errors
    /// [`Error::UnsafeStore`] when the store ignores the create condition or does not
    /// support it; [`Error::InvalidSettings`]; [`Error::Store`] when the probe cannot run.
    pub async fn open_with(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        settings: Settings,
        clock: Arc<dyn Clock>,
        failpoints: Option<Arc<dyn Failpoints>>,
    ) -> Result<Replica, Error> {
        settings.check()?;
        let layout = Layout::new(prefix);
        let probe = layout.probe(&new_nonce()?);
        let body = || PutPayload::from(Bytes::from_static(b"idem create-only probe"));
        let first = store.put_opts(&probe, body(), PutMode::Create.into()).await;
        match first {
            Ok(_) => {}
            Err(
                object_store::Error::NotImplemented { .. }
                | object_store::Error::NotSupported { .. },
            ) => {
                return Err(Error::UnsafeStore {
                    reason: format!("{store} does not support create-only puts"),
                });
            }
            Err(source) => return Err(Error::store("put", &probe, source)),
        }
        let second = store.put_opts(&probe, body(), PutMode::Create.into()).await;
        let _ = store.delete(&probe).await;
        match second {
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => {}
            Ok(_) => {
                return Err(Error::UnsafeStore {
                    reason: format!(
                        "{store} accepted a create-only put on an existing object: it ignores the condition"
                    ),
                });
            }
            Err(source) => return Err(Error::store("put", &probe, source)),
        }
        Ok(Replica {
            inner: Arc::new(Inner {
                store,
                layout,
                settings,
                clock,
                failpoints,
                instance: new_nonce()?,
                read_only: false,
            }),
        })
    }

    /// Opens for reading only (inspect, verify, restore, listing effects): no probe, and
    /// nothing through this handle ever writes to the store — claims and retention are
    /// refused with [`Error::ReadOnly`] — so read-only credentials (an auditor's) suffice.
    ///
    /// # Errors
    /// [`Error::InvalidSettings`].
    pub fn open_read_only(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        settings: Settings,
    ) -> Result<Replica, Error> {
        settings.check()?;
        Ok(Replica {
            inner: Arc::new(Inner {
                store,
                layout: Layout::new(prefix),
                settings,
                clock: Arc::new(SystemClock),
                failpoints: None,
                instance: new_nonce()?,
                read_only: true,
            }),
        })
    }

    pub(crate) fn writable(&self, op: &'static str) -> Result<(), Error> {
        if self.inner.read_only {
            return Err(Error::ReadOnly { op });
        }
        Ok(())
    }

    /// The settings in use.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.store
    }

    pub(crate) async fn failpoint(&self, point: FailPoint, org: &OrgId) -> Result<(), Error> {
        match &self.inner.failpoints {
            Some(fp) => fp.hit(point, org).await.map_err(|message| Error::Injected {
                point,
                org: org.to_string(),
                message,
            }),
            None => Ok(()),
        }
    }

    /// Claims the next round for `org` (highest round seen + 1) with a create-only log entry,
    /// fencing every older writer (I7), and writes the advisory lease.
    ///
    /// A live lease of another writer blocks the claim unless `force`; a `Release` entry at
    /// the head lets it through at once. A lease of the same `writer` id blocks too unless it
    /// is this instance's own (this [`Replica`]): two live processes configured with one
    /// writer id never take orgs from each other. See [`Replica::claim_from`] for a restart.
    ///
    /// # Errors
    /// [`Error::LeaseHeld`]; [`Error::Contended`] after `claim_retries` lost races;
    /// [`Error::StoreRefused`] when the store refuses the claim's write;
    /// [`Error::InvalidWriter`]; [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`]
    /// for an unreadable log.
    pub async fn claim(&self, org: &OrgId, writer: &str, force: bool) -> Result<Claim, Error> {
        self.claim_from(org, writer, None, force).await
    }

    /// [`Replica::claim`] by a writer working in a data directory with id `home.0`. The
    /// lease records the home; when `home.1` is true — the caller holds that directory's
    /// exclusive lock, which every earlier process working in it held until it died — a live
    /// lease of the same writer id and the same home belongs to a dead process and does not
    /// block the claim (a restart after `kill -9` claims at once).
    ///
    /// # Errors
    /// As [`Replica::claim`].
    pub async fn claim_from(
        &self,
        org: &OrgId,
        writer: &str,
        home: Option<(&str, bool)>,
        force: bool,
    ) -> Result<Claim, Error> {
        self.writable("claim")?;
        check_writer(writer)?;
        let attempts = self.inner.settings.claim_retries.saturating_add(1);
        for attempt in 0..attempts {
            let log = self.history(org).await?;
            let head = log.last().map(LogEntry::seq).unwrap_or(0);
            let max_round = log.iter().map(LogEntry::round).max().unwrap_or(0);
            let now = self.inner.clock.now_ms();
            if !force && let Some(lease) = self.lease(org).await? {
                let released = matches!(log.last(), Some(LogEntry::Release { round, .. }) if *round >= lease.round);
                let ours = lease.writer == writer
                    && (lease.instance == self.inner.instance
                        || home.is_some_and(|(id, locked)| {
                            locked && lease.home.as_deref() == Some(id)
                        }));
                if !ours && lease.expires_at_ms > now && !released && lease.round >= max_round {
                    return Err(Error::LeaseHeld {
                        org: org.to_string(),
                        holder: lease.writer,
                        expires_at_ms: lease.expires_at_ms,
                    });
                }
            }
            self.failpoint(FailPoint::ClaimBeforePublish, org).await?;
            let entry = LogEntry::Claim {
                seq: head + 1,
                round: max_round + 1,
                writer: writer.to_owned(),
                nonce: new_nonce()?,
                at_ms: now,
            };
            match self.publish(org, &entry).await {
                Ok(Published::Landed) => {}
                Ok(Published::Taken(theirs)) => {
                    debug!(%org, seq = head + 1, theirs = theirs.round(), attempt, "claim lost the race");
                    continue;
                }
                // A claim of unknown outcome fences nobody we care about: retry higher.
                Err(Error::Unknown { .. }) => continue,
                Err(e) => return Err(e),
            }
            // A claimer that read a stale head may land in a slot retention freed.
            if self.max_seq(org).await? > head + 1 {
                debug!(%org, seq = head + 1, attempt, "claim landed below a newer entry");
                continue;
            }
            let LogEntry::Claim {
                seq, round, nonce, ..
            } = entry
            else {
                continue;
            };
            self.failpoint(FailPoint::ClaimAfterPublish, org).await?;
            // Only a holder of the home's lock names it: a process waiting for the lock (the
            // old one still runs) must not write leases the old one would take as its own.
            let home = home
                .filter(|(_, locked)| *locked)
                .map(|(id, _)| id.to_owned());
            let lease = Lease {
                writer: writer.to_owned(),
                round,
                expires_at_ms: now + self.inner.settings.lease_ms,
                instance: self.inner.instance.clone(),
                home: home.clone(),
            };
            self.put_lease(org, &lease).await;
            info!(%org, round, seq, writer, "claimed");
            return Ok(Claim {
                org: org.clone(),
                round,
                writer: writer.to_owned(),
                nonce,
                seq,
                next_seq: seq + 1,
                lease_renewed_ms: now,
                home,
                unusable: None,
                tip: None,
                snapshot_tip: None,
            });
        }
        Err(Error::Contended {
            org: org.to_string(),
            attempts,
        })
    }

    fn usable(claim: &Claim) -> Result<(), Error> {
        match claim.unusable {
            Some(reason) => Err(Error::ClaimUnusable {
                org: claim.org.to_string(),
                round: claim.round,
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Compresses and uploads `snapshot` under a unique blob name, then publishes a
    /// create-only Snapshot entry at the claim's next seq and checks nothing newer exists
    /// above it. Only an `Ok` means the snapshot is durably published under this round (I6).
    /// The snapshot becomes the claim's chain tip: later deltas apply to it.
    ///
    /// # Errors
    /// [`Error::Fenced`] when a newer entry holds our slot or sits above it (I7, I11);
    /// [`Error::Unknown`] when a publish could not be settled by re-reading (I9); both make
    /// the claim unusable. [`Error::Store`]/[`Error::Injected`] before publishing (retry the
    /// ship); [`Error::InvalidSnapshot`]; [`Error::ClaimUnusable`].
    pub async fn ship(&self, claim: &mut Claim, snapshot: Snapshot) -> Result<Shipped, Error> {
        Self::usable(claim)?;
        let org = claim.org.clone();
        snapshot.check(org.as_str())?;
        let level = self.inner.settings.zstd_level;
        let commit = snapshot.commit();
        let (packed, hashes) = blocking("compressing a snapshot", move || {
            let hashes = PageHashes::of_image("<snapshot>", snapshot.bytes()).map_err(|e| {
                Error::InvalidSnapshot {
                    org: String::new(),
                    reason: e.to_string(),
                }
            })?;
            Ok((pack(snapshot.bytes(), level)?, hashes))
        })
        .await?;
        let name = blob_name(claim.next_seq, claim.round, &new_nonce()?);
        let shipped = self
            .upload_and_publish(claim, packed, name, |common| LogEntry::Snapshot {
                seq: common.seq,
                round: common.round,
                writer: common.writer,
                nonce: common.nonce,
                at_ms: common.at_ms,
                blob: common.blob,
                sha256: common.sha256,
                bytes: common.bytes,
                compressed_bytes: common.compressed_bytes,
                commit,
            })
            .await?;
        let tip = Tip {
            seq: shipped.seq,
            hashes: Arc::new(hashes),
        };
        claim.snapshot_tip = Some(tip.clone());
        claim.tip = Some(tip);
        Ok(shipped)
    }

    /// Ships the pages changed since the claim's chain tip: uploads the delta body, publishes
    /// a create-only Delta entry naming the tip as its base with the database checksum before
    /// and after it, and checks nothing newer exists above it. Costs O(changed pages), not
    /// O(database). Same acknowledgement and fencing rules as [`Replica::ship`] (I6, I7, I9).
    ///
    /// A [compacted](Delta::compacted) delta names the chain's snapshot as its base instead,
    /// so a hydrate skips the deltas before it; it is refused unless applying it to the
    /// snapshot gives exactly the database the tip plus its pages gives.
    ///
    /// # Errors
    /// [`Error::NoChainTip`] when the claim has shipped no snapshot yet (ship a full snapshot);
    /// [`Error::InvalidSnapshot`] when the page size differs from the tip's, a page was
    /// [encoded](Delta::encode_against) against content the tip does not hold, or a
    /// compacted delta misses a page changed since the snapshot (nothing is published);
    /// otherwise as [`Replica::ship`].
    pub async fn ship_delta(&self, claim: &mut Claim, delta: Delta) -> Result<Shipped, Error> {
        Self::usable(claim)?;
        let org = claim.org.clone();
        let tip = match &claim.tip {
            Some(tip) if tip.seq + 1 == claim.next_seq => tip.clone(),
            _ => {
                return Err(Error::NoChainTip {
                    org: org.to_string(),
                    round: claim.round,
                });
            }
        };
        if delta.page_size() != tip.hashes.page_size() {
            return Err(Error::InvalidSnapshot {
                org: org.to_string(),
                reason: format!(
                    "delta page size {} but the database has {}",
                    delta.page_size(),
                    tip.hashes.page_size()
                ),
            });
        }
        let level = self.inner.settings.zstd_level;
        let commit = delta.commit();
        let base = match (&claim.snapshot_tip, delta.is_compacted()) {
            (Some(snapshot), true) => snapshot.clone(),
            _ => tip.clone(),
        };
        let mut delta = delta;
        // The tip comparison must see the pages as the caller gave them: filled zero pages
        // would override the tip's content and hide a grown page the caller missed.
        let unfilled = delta.is_compacted().then(|| delta.clone());
        delta.fill_growth(base.hashes.pages());
        let (db_pages, page_size) = (delta.db_pages(), delta.page_size());
        let changed_pages = delta.changed_pages() as u32;
        let (tip_hashes, base_hashes) = (tip.hashes.clone(), base.hashes.clone());
        let org_name = org.to_string();
        let (packed, change) = blocking("compressing a delta", move || {
            if let Some(page) = base_hashes.wrong_base(&delta) {
                return Err(Error::InvalidSnapshot {
                    org: org_name,
                    reason: format!(
                        "page {page} was encoded against content the chain tip does not hold"
                    ),
                });
            }
            let change = base_hashes.change(&delta);
            if let Some(unfilled) = &unfilled
                && tip_hashes.change(unfilled).sum != change.sum
            {
                return Err(Error::InvalidSnapshot {
                    org: org_name,
                    reason: "compacted delta misses a page changed since the snapshot".into(),
                });
            }
            Ok((pack(&delta.encode(), level)?, change))
        })
        .await?;
        let (base_checksum, checksum) = (base.hashes.sum(), change.sum);
        let name = delta_blob_name(claim.next_seq, claim.round, &new_nonce()?);
        let shipped = self
            .upload_and_publish(claim, packed, name, |common| LogEntry::Delta {
                seq: common.seq,
                round: common.round,
                writer: common.writer,
                nonce: common.nonce,
                at_ms: common.at_ms,
                blob: common.blob,
                sha256: common.sha256,
                bytes: common.bytes,
                compressed_bytes: common.compressed_bytes,
                commit,
                base: base.seq,
                base_checksum: checksum_hex(base_checksum),
                checksum: checksum_hex(checksum),
                page_size,
                db_pages,
                changed_pages,
            })
            .await?;
        // Update the base's hashes in place: once the claim lets go of its tip, the table is
        // usually ours alone (a compaction, or the first delta after a snapshot, copies it once).
        drop(tip);
        claim.tip = None;
        let mut hashes = base.hashes;
        Arc::make_mut(&mut hashes).apply_change(change);
        claim.tip = Some(Tip {
            seq: shipped.seq,
            hashes,
        });
        Ok(shipped)
    }

    /// Uploads a packed blob under `name`, publishes the entry `make` builds at the claim's
    /// next seq, checks for a successor, renews the lease.
    async fn upload_and_publish(
        &self,
        claim: &mut Claim,
        packed: Packed,
        name: String,
        make: impl FnOnce(EntryCommon) -> LogEntry,
    ) -> Result<Shipped, Error> {
        let org = claim.org.clone();
        let started = std::time::Instant::now();
        let seq = claim.next_seq;
        let blob_path = self.inner.layout.blob(&org, &name);
        let nonce = new_nonce()?;
        let compressed_bytes = packed.blob.len() as u64;
        self.failpoint(FailPoint::ShipBeforeUpload, &org).await?;
        self.inner
            .store
            .put(&blob_path, PutPayload::from(packed.blob))
            .await
            .map_err(|e| Error::store("put", &blob_path, e))?;
        self.failpoint(FailPoint::ShipAfterUpload, &org).await?;
        let entry = make(EntryCommon {
            seq,
            round: claim.round,
            writer: claim.writer.clone(),
            nonce,
            at_ms: self.inner.clock.now_ms(),
            blob: name,
            sha256: packed.sha256,
            bytes: packed.bytes,
            compressed_bytes,
        });
        self.publish_for_claim(claim, &entry).await?;
        self.failpoint(FailPoint::ShipAfterPublish, &org).await?;
        self.check_no_successor(claim, seq).await?;
        self.renew_lease(claim).await;
        info!(%org, round = claim.round, seq, kind = entry.kind_name(), bytes = packed.bytes,
              compressed_bytes, elapsed_ms = started.elapsed().as_millis() as u64, "shipped");
        Shipped::from_entry(&entry, |b| self.inner.layout.blob(&org, b).to_string()).ok_or_else(
            || Error::InvalidSnapshot {
                org: org.to_string(),
                reason: "shipped entry is not a snapshot or delta".into(),
            },
        )
    }

    /// Publishes a Release entry (same create/compare/fence rules as ship) and drops the
    /// lease, so the next claim goes through at once. The claim is unusable afterwards.
    ///
    /// # Errors
    /// As [`Replica::ship`]'s publish step.
    pub async fn release(&self, claim: &mut Claim) -> Result<(), Error> {
        Self::usable(claim)?;
        let org = claim.org.clone();
        self.failpoint(FailPoint::ReleaseBeforePublish, &org)
            .await?;
        let seq = claim.next_seq;
        let entry = LogEntry::Release {
            seq,
            round: claim.round,
            writer: claim.writer.clone(),
            nonce: new_nonce()?,
            at_ms: self.inner.clock.now_ms(),
        };
        self.publish_for_claim(claim, &entry).await?;
        claim.unusable = Some("released");
        self.check_no_successor(claim, seq).await?;
        let path = self.inner.layout.lease(&org);
        if let Ok(Some(lease)) = self.lease(&org).await
            && lease.writer == claim.writer
            && lease.round == claim.round
            && let Err(e) = self.inner.store.delete(&path).await
        {
            warn!(%org, round = claim.round, error = %e, "could not drop lease after release");
        }
        info!(%org, round = claim.round, seq, "released");
        Ok(())
    }

    /// Publishes `entry` at `claim.next_seq`; maps a taken slot to `Fenced` and an unknown
    /// outcome to `Unknown`, making the claim unusable in both cases.
    async fn publish_for_claim(&self, claim: &mut Claim, entry: &LogEntry) -> Result<(), Error> {
        match self.publish(&claim.org, entry).await {
            Ok(Published::Landed) => {
                claim.next_seq = entry.seq() + 1;
                Ok(())
            }
            Ok(Published::Taken(theirs)) => {
                claim.unusable = Some("fenced");
                warn!(org = %claim.org, round = claim.round, seq = entry.seq(), theirs = theirs.round(), "fenced");
                Err(Error::Fenced {
                    org: claim.org.to_string(),
                    ours: claim.round,
                    theirs: theirs.round(),
                })
            }
            Err(e) => {
                if matches!(e, Error::Unknown { .. }) {
                    claim.unusable = Some("outcome of a publish is unknown");
                }
                Err(e)
            }
        }
    }

    /// Keeps an idle writer's advisory lease alive. Once more than half of `lease_ms` has
    /// elapsed since the last renewal, confirms that no successor appended to the log since
    /// this claim's last entry, then renews `lease.json`. Ships renew the lease themselves;
    /// this is for orgs without traffic, so a live writer's lease does not lapse while it idles
    /// (which would let another writer claim without `force` and fence it on its next ship).
    ///
    /// # Errors
    /// [`Error::Fenced`] when a successor appended (the claim becomes unusable, I7);
    /// [`Error::ClaimUnusable`]; [`Error::Store`] when the log cannot be listed.
    pub async fn keep_alive(&self, claim: &mut Claim) -> Result<(), Error> {
        Self::usable(claim)?;
        let now = self.inner.clock.now_ms();
        if now.saturating_sub(claim.lease_renewed_ms) * 2 <= self.inner.settings.lease_ms {
            return Ok(());
        }
        // Confirming renews the lease.
        self.confirm(claim).await
    }

    /// Confirms that this claim still owns the org: no entry was appended to the log after
    /// the claim's last entry (one LIST). A writer answers a replay or a read only after a
    /// ship or a confirmation that started after the request arrived, so a fenced writer never
    /// acknowledges from its local file (I6, I7). Renews the advisory lease once past half
    /// its term, as a ship does, so a writer serving only replays keeps its org.
    ///
    /// # Errors
    /// [`Error::Fenced`] when a successor appended (the claim becomes unusable);
    /// [`Error::ClaimUnusable`]; [`Error::Store`] when the log cannot be listed.
    pub async fn confirm(&self, claim: &mut Claim) -> Result<(), Error> {
        Self::usable(claim)?;
        let last = claim.next_seq.saturating_sub(1);
        self.check_no_successor(claim, last).await?;
        // A writer that only answers replays and reads is active: it must not look dead.
        self.renew_lease(claim).await;
        Ok(())
    }

    /// After our create at `seq`, anything above it means a successor owns the org (I11).
    /// One LIST; only the highest entry above is read (for the error's `theirs`), so the cost
    /// does not grow with the length of the log.
    async fn check_no_successor(&self, claim: &mut Claim, seq: u64) -> Result<(), Error> {
        let above: Vec<u64> = self
            .log_seqs_after(&claim.org, Some(seq))
            .await?
            .into_iter()
            .filter(|s| *s > seq)
            .collect();
        let Some(&top) = above.iter().max() else {
            return Ok(());
        };
        claim.unusable = Some("fenced");
        let theirs = match self.read_entry(&claim.org, top).await {
            Ok(Some(entry)) => entry.round(),
            // Unreadable or gone (retention): still a successor; report the next round.
            _ => claim.round + 1,
        };
        warn!(org = %claim.org, round = claim.round, seq, theirs, "successor above our entry");
        Err(Error::Fenced {
            org: claim.org.to_string(),
            ours: claim.round,
            theirs,
        })
    }

    async fn renew_lease(&self, claim: &mut Claim) {
        let now = self.inner.clock.now_ms();
        if now.saturating_sub(claim.lease_renewed_ms) * 2 > self.inner.settings.lease_ms {
            let lease = Lease {
                writer: claim.writer.clone(),
                round: claim.round,
                expires_at_ms: now + self.inner.settings.lease_ms,
                instance: self.inner.instance.clone(),
                home: claim.home.clone(),
            };
            if self.put_lease(&claim.org, &lease).await {
                claim.lease_renewed_ms = now;
            }
        }
    }

    /// Writes the advisory lease; a failure is logged, never fatal (the log fences, not the lease).
    async fn put_lease(&self, org: &OrgId, lease: &Lease) -> bool {
        let path = self.inner.layout.lease(org);
        let body = match lease.encode() {
            Ok(b) => b,
            Err(_) => return false,
        };
        match self.inner.store.put(&path, PutPayload::from(body)).await {
            Ok(_) => true,
            Err(e) => {
                warn!(%org, round = lease.round, error = %e, "could not write lease");
                false
            }
        }
    }

    /// Create-only put of a log entry, settled by re-reading and comparing the whole entry (I9).
    pub(crate) async fn publish(&self, org: &OrgId, entry: &LogEntry) -> Result<Published, Error> {
        let seq = entry.seq();
        let path = self.inner.layout.log(org, seq);
        let body = Bytes::from(entry.encode()?);
        let mut retried = false;
        loop {
            let put = self
                .inner
                .store
                .put_opts(
                    &path,
                    PutPayload::from(body.clone()),
                    PutMode::Create.into(),
                )
                .await;
            let cause = match put {
                Ok(_) => return Ok(Published::Landed),
                Err(
                    e @ (object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. }),
                ) => Some(e),
                Err(e) => {
                    debug!(%org, seq, error = %e, "publish outcome unknown; re-reading");
                    Some(e)
                }
            };
            let unknown = |source: Error| Error::Unknown {
                org: org.to_string(),
                seq,
                source: Box::new(source),
            };
            match self.read_entry(org, seq).await {
                Ok(Some(found)) if found == *entry => return Ok(Published::Landed),
                Ok(Some(found)) => return Ok(Published::Taken(Box::new(found))),
                Ok(None) if !retried => {
                    retried = true;
                    continue;
                }
                // Put failed twice and the slot read back empty twice: the store refused
                // it. A put that still lands later holds our own entry, which a later
                // create at this slot reads back as taken: conservative, never an ack.
                Ok(None) => {
                    let source = match cause {
                        Some(source) => Error::store("put", &path, source),
                        None => Error::MissingObject {
                            path: path.to_string(),
                        },
                    };
                    return Err(Error::StoreRefused {
                        org: org.to_string(),
                        seq,
                        source: Box::new(source),
                    });
                }
                Err(e) => return Err(unknown(e)),
            }
        }
    }

    /// Reads one log entry; `None` when absent.
    pub(crate) async fn read_entry(
        &self,
        org: &OrgId,
        seq: u64,
    ) -> Result<Option<LogEntry>, Error> {
        let path = self.inner.layout.log(org, seq);
        match self.get_bytes(&path).await? {
            Some(b) => LogEntry::decode(path.as_ref(), &b, Some(seq)).map(Some),
            None => Ok(None),
        }
    }

    pub(crate) async fn get_bytes(&self, path: &Path) -> Result<Option<Bytes>, Error> {
        let got = match self.inner.store.get(path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(Error::store("get", path, e)),
        };
        match got.bytes().await {
            Ok(b) => Ok(Some(b)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::store("get", path, e)),
        }
    }

    /// Log positions present for `org`, ascending.
    pub(crate) async fn log_seqs(&self, org: &OrgId) -> Result<Vec<u64>, Error> {
        self.log_seqs_after(org, None).await
    }

    /// Log positions strictly above `after` (all of them for `None`), sorted. With a bound it
    /// lists from that name on (S3 `start-after`), so the cost follows the entries above, not
    /// the length of the log.
    pub(crate) async fn log_seqs_after(
        &self,
        org: &OrgId,
        after: Option<u64>,
    ) -> Result<Vec<u64>, Error> {
        let dir = self.inner.layout.log_dir(org);
        let listing = match after {
            Some(seq) => self
                .inner
                .store
                .list_with_offset(Some(&dir), &self.inner.layout.log(org, seq)),
            None => self.inner.store.list(Some(&dir)),
        };
        let metas: Vec<_> = listing
            .try_collect()
            .await
            .map_err(|e| Error::store("list", &dir, e))?;
        let mut seqs = Vec::with_capacity(metas.len());
        for m in metas {
            let name = m.location.filename().unwrap_or("");
            match parse_log_name(name) {
                Some(seq)
                    if m.location.prefix_matches(&dir)
                        && m.location.parts().count() == dir.parts().count() + 1 =>
                {
                    seqs.push(seq)
                }
                // Not a log entry's name (an editor's backup, a `.DS_Store`): no entry is
                // ever written under another name, so it is not history; skip it, loudly.
                _ => {
                    tracing::warn!(%org, object = %m.location, "skipping an object that is not a log entry");
                }
            }
        }
        seqs.sort_unstable();
        Ok(seqs)
    }

    async fn max_seq(&self, org: &OrgId) -> Result<u64, Error> {
        Ok(self.log_seqs(org).await?.last().copied().unwrap_or(0))
    }

    /// Every log entry of `org`, sorted by seq. Entries deleted between listing and reading
    /// (retention) are skipped.
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable entry.
    pub async fn history(&self, org: &OrgId) -> Result<Vec<LogEntry>, Error> {
        let seqs = self.log_seqs(org).await?;
        let entries: Vec<Option<LogEntry>> =
            futures::stream::iter(seqs.into_iter().map(|s| self.read_entry(org, s)))
                .buffered(self.inner.settings.read_concurrency)
                .try_collect()
                .await?;
        Ok(entries.into_iter().flatten().collect())
    }

    /// Orgs present in the store (those with any object under `orgs/<org>/`), sorted.
    ///
    /// # Errors
    /// [`Error::Store`]. Directory names that are not valid org ids are skipped.
    pub async fn orgs(&self) -> Result<Vec<OrgId>, Error> {
        let dir = self.inner.layout.orgs();
        let list = self
            .inner
            .store
            .list_with_delimiter(Some(&dir))
            .await
            .map_err(|e| Error::store("list", &dir, e))?;
        let mut orgs: Vec<OrgId> = list
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().and_then(|n| OrgId::new(n).ok()))
            .collect();
        orgs.sort();
        orgs.dedup();
        Ok(orgs)
    }

    /// The advisory lease of `org`, if any.
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for an unreadable lease.
    pub async fn lease(&self, org: &OrgId) -> Result<Option<Lease>, Error> {
        let path = self.inner.layout.lease(org);
        match self.get_bytes(&path).await? {
            Some(b) => Lease::decode(path.as_ref(), &b).map(Some),
            None => Ok(None),
        }
    }
}
