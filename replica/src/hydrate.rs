//! Hydrate, restore and verify: rebuild a published position from its snapshot and the
//! delta chain after it, prove it with checksums, install it (I8, I10).

use std::path::Path;

use futures::future::Either;
use futures::{StreamExt, TryStreamExt};
use tracing::{debug, info};

use crate::delta::{DeltaBody, PageHashes, checksum_hex};
use crate::layout::new_nonce;
use crate::replica::blocking;
use crate::snapshot::{install, integrity_check_image, remove_db, unpack};
use crate::{Claim, Error, FailPoint, Hydrated, LogEntry, OrgId, Replica, Shipped, VerifyReport};

/// A published position: a snapshot entry and the deltas after it, in order.
struct Chain {
    snapshot: LogEntry,
    deltas: Vec<LogEntry>,
}

impl Chain {
    fn position(&self) -> u64 {
        self.deltas.last().unwrap_or(&self.snapshot).seq()
    }
}

fn broken(org: &OrgId, seq: u64, reason: impl Into<String>) -> Error {
    Error::ChainBroken {
        org: org.to_string(),
        seq,
        reason: reason.into(),
    }
}

/// The newest snapshot in `log` and the deltas after it that rebuild the newest state,
/// considering only entries with seq < `limit`: from the newest compacted delta (base = the
/// snapshot) on, or all of them. Entries after the snapshot are contiguous (retention never
/// deletes them, and every publish takes the next free seq), so a missing seq (other than
/// before a compacted delta), a delta of another round, or a delta whose base is neither the
/// previous chain entry nor the snapshot is a broken chain — never a reason to stop early and
/// install an older state (I10).
fn resolve(org: &OrgId, log: &[LogEntry], limit: u64) -> Result<Option<Chain>, Error> {
    let below: Vec<&LogEntry> = log.iter().filter(|e| e.seq() < limit).collect();
    let Some(start) = below
        .iter()
        .rposition(|e| matches!(e, LogEntry::Snapshot { .. }))
    else {
        // Published deltas but no snapshot under them: the snapshot they need is gone. An
        // empty database here would silently drop acknowledged state (I10).
        if let Some(d) = below.iter().find(|e| matches!(e, LogEntry::Delta { .. })) {
            return Err(broken(org, d.seq(), "no snapshot entry below this delta"));
        }
        return Ok(None);
    };
    let snapshot = below[start].clone();
    let round = snapshot.round();
    let mut deltas = Vec::new();
    let (mut prev_seq, mut tip) = (snapshot.seq(), snapshot.seq());
    let mut ended = false;
    // A compacted delta applies to the snapshot and supersedes the deltas before it: start
    // from the newest one, so the entries between (which a reader may skip) do not matter.
    let is_compacted = |e: &LogEntry| matches!(e, LogEntry::Delta { base, .. } if *base == snapshot.seq() && e.round() == round);
    let from = below[start + 1..]
        .iter()
        .rposition(|e| is_compacted(e))
        .map_or(start + 1, |i| start + 1 + i);
    for e in &below[from..] {
        let compacted = is_compacted(e);
        if e.seq() != prev_seq + 1 && !compacted {
            return Err(broken(
                org,
                prev_seq + 1,
                "log entry missing after the newest snapshot",
            ));
        }
        prev_seq = e.seq();
        match e {
            LogEntry::Delta { .. } if !ended && e.round() == round && compacted => {
                tip = e.seq();
                deltas.clear();
                deltas.push((*e).clone());
            }
            LogEntry::Delta { base, .. } if !ended && e.round() == round && *base == tip => {
                tip = e.seq();
                deltas.push((*e).clone());
            }
            LogEntry::Delta { base, .. } => {
                return Err(broken(
                    org,
                    e.seq(),
                    format!(
                        "delta of round {} applies to seq {base}, but the chain of round {round} ends at seq {tip}",
                        e.round()
                    ),
                ));
            }
            LogEntry::Snapshot { .. } => {
                return Err(broken(org, e.seq(), "snapshot after the newest snapshot"));
            }
            _ => ended = true,
        }
    }
    Ok(Some(Chain { snapshot, deltas }))
}

impl Replica {
    /// Installs at `dest` the newest state published before `claim` (I8): the newest
    /// snapshot, then every delta after it.
    ///
    /// Verifies size and sha256 of every blob, the database checksum before and after each
    /// delta, and runs `quick_check` on a temp file in `dest`'s directory before renaming it
    /// into place and fsyncing the directory. Any existing file at `dest` (and its
    /// `-wal`/`-shm`/`-journal`) is replaced: the local file is a cache, never an authority.
    /// With no snapshot yet, `dest` is removed and nothing is created (`snapshot: None,
    /// commit: 0`). `dest` must not be open by anyone: name local files per claim.
    ///
    /// # Errors
    /// [`Error::MissingObject`]/[`Error::Corrupt`]/[`Error::ChainBroken`] when the newest
    /// state cannot be rebuilt exactly; never falls back to an older one (I10).
    /// [`Error::Store`], [`Error::Io`].
    pub async fn hydrate(&self, claim: &Claim, dest: &Path) -> Result<Hydrated, Error> {
        let log = self.tail(&claim.org, claim.seq).await?;
        let chain = resolve(&claim.org, &log, claim.seq)?;
        self.install_chain(&claim.org, chain, dest).await
    }

    /// Installs any published position of `org` at `dest`: `at: None` = the newest,
    /// `Some(seq)` = the state published by the snapshot or delta entry at that log position
    /// (point-in-time restore). Same checks and atomicity as [`Replica::hydrate`].
    ///
    /// # Errors
    /// As [`Replica::hydrate`]; [`Error::NoSuchSnapshot`] when `at` names no snapshot or
    /// delta entry.
    pub async fn restore(
        &self,
        org: &OrgId,
        at: Option<u64>,
        dest: &Path,
    ) -> Result<Hydrated, Error> {
        let Some(seq) = at else {
            // The newest state may be retired by retention (a newer snapshot landed) between
            // reading the log and downloading its blobs: read the log again, a few times,
            // before reporting a missing blob.
            let mut attempt = 0;
            loop {
                attempt += 1;
                let log = self.tail(org, u64::MAX).await?;
                let chain = resolve(org, &log, u64::MAX)?;
                match self.install_chain(org, chain, dest).await {
                    Err(Error::MissingObject { .. }) if attempt < 4 => continue,
                    other => return other,
                }
            }
        };
        let log = self.history(org).await?;
        if !matches!(
            log.iter().find(|e| e.seq() == seq),
            Some(LogEntry::Snapshot { .. } | LogEntry::Delta { .. })
        ) {
            return Err(Error::NoSuchSnapshot {
                org: org.to_string(),
                seq,
            });
        }
        let chain = resolve(org, &log, seq.saturating_add(1))?;
        if chain.as_ref().map(Chain::position) != Some(seq) {
            return Err(broken(
                org,
                seq,
                "delta is not on the chain of any snapshot",
            ));
        }
        self.install_chain(org, chain, dest).await
    }

    /// The entries a hydrate of the newest state below `limit` needs, read from the head
    /// down: every entry after the newest snapshot, or after the newest compacted delta plus
    /// that delta's snapshot. One LIST, then one GET per entry of that tail — not per entry of
    /// the log, which keeps every delta a kept snapshot still has for point-in-time restore.
    async fn tail(&self, org: &OrgId, limit: u64) -> Result<Vec<LogEntry>, Error> {
        const ATTEMPTS: u32 = 4;
        for attempt in 1..=ATTEMPTS {
            if let Some(tail) = self.try_tail(org, limit, attempt == ATTEMPTS).await? {
                return Ok(tail);
            }
        }
        Err(Error::LogChanged {
            org: org.to_string(),
            attempts: ATTEMPTS,
        })
    }

    /// One attempt of [`Replica::tail`]; `None` when a listed entry vanished before it was
    /// read (retention deleting what this read still needed): skipping it could leave an
    /// older state, or none, looking like the newest (I10). On the `last` attempt a compacted
    /// delta whose snapshot is still missing is returned without it, which `resolve` reports
    /// as a broken chain (damage, not a race).
    async fn try_tail(
        &self,
        org: &OrgId,
        limit: u64,
        last: bool,
    ) -> Result<Option<Vec<LogEntry>>, Error> {
        let seqs: Vec<u64> = self
            .log_seqs(org)
            .await?
            .into_iter()
            .filter(|s| *s < limit)
            .collect();
        let n = self.inner.settings.read_concurrency.max(1);
        let mut down: Vec<LogEntry> = Vec::new();
        let mut end = seqs.len();
        while end > 0 {
            let start = end.saturating_sub(n);
            let reads: Vec<_> = seqs[start..end]
                .iter()
                .map(|s| self.read_entry(org, *s))
                .collect();
            let batch: Vec<Option<LogEntry>> = futures::stream::iter(reads)
                .buffered(n)
                .try_collect()
                .await?;
            for e in batch.into_iter().rev() {
                let Some(e) = e else { return Ok(None) };
                match &e {
                    LogEntry::Snapshot { .. } => {
                        down.push(e);
                        down.reverse();
                        return Ok(Some(down));
                    }
                    // A compacted delta: its base is the chain's snapshot, and the deltas
                    // between are superseded.
                    LogEntry::Delta { base, .. } if base.saturating_add(1) < e.seq() => {
                        let (base, round) = (*base, e.round());
                        down.push(e);
                        match self.read_entry(org, base).await? {
                            Some(s @ LogEntry::Snapshot { .. }) if s.round() == round => {
                                down.push(s)
                            }
                            // Not a snapshot of its round: not a compaction; `resolve` judges
                            // it against the newest snapshot, which the read goes on to find.
                            Some(_) => continue,
                            None if last => {}
                            None => return Ok(None),
                        }
                        down.reverse();
                        return Ok(Some(down));
                    }
                    _ => down.push(e),
                }
            }
            end = start;
        }
        down.reverse();
        Ok(Some(down))
    }

    /// Downloads and fully checks every published snapshot (size, sha256,
    /// `integrity_check`) and every delta (size, sha256, and the database checksum before and
    /// after it, replayed from its snapshot). A delta that no snapshot's chain reaches is
    /// reported as failed.
    ///
    /// Retention may retire entries while verify reads them: a failure of an entry that is
    /// no longer in the log is that race, not damage, and verify reads the log again (a few
    /// times, as restore does) instead of reporting it.
    ///
    /// # Errors
    /// [`Error::Store`] or an unreadable log; per-entry failures go in the report.
    pub async fn verify(&self, org: &OrgId) -> Result<VerifyReport, Error> {
        let mut attempt = 0;
        loop {
            let report = self.verify_once(org).await?;
            attempt += 1;
            let mut retired = false;
            for (seq, _) in &report.failed {
                if self.read_entry(org, *seq).await?.is_none() {
                    retired = true;
                    break;
                }
            }
            if !retired || attempt >= 4 {
                return Ok(report);
            }
            debug!(%org, attempt, "verify raced retention; reading the log again");
        }
    }

    async fn verify_once(&self, org: &OrgId) -> Result<VerifyReport, Error> {
        let log = self.history(org).await?;
        let mut report = VerifyReport::default();
        let mut reached = std::collections::HashSet::new();
        for (i, entry) in log.iter().enumerate() {
            if !matches!(entry, LogEntry::Snapshot { .. }) {
                continue;
            }
            let chain = Chain {
                snapshot: entry.clone(),
                deltas: chain_after(&log[i + 1..], entry),
            };
            reached.extend(chain.deltas.iter().map(LogEntry::seq));
            self.verify_chain(org, &chain, &mut report).await;
        }
        for e in log.iter().filter(|e| matches!(e, LogEntry::Delta { .. })) {
            if !reached.contains(&e.seq()) {
                let why = broken(org, e.seq(), "delta is not on the chain of any snapshot");
                report.failed.push((e.seq(), why));
            }
        }
        report.ok.sort_unstable();
        Ok(report)
    }

    /// Checks a snapshot, then each delta of its chain in order, reporting the first entry
    /// that fails and every delta after it (they cannot be rebuilt).
    async fn verify_chain(&self, org: &OrgId, chain: &Chain, report: &mut VerifyReport) {
        let snap = chain.snapshot.seq();
        let fetched = match self.fetch(org, &chain.snapshot).await {
            Ok((object, image)) => {
                blocking("checking a snapshot", move || {
                    integrity_check_image(&object, &image)?;
                    let hashes = PageHashes::of_image(&object, &image)?;
                    Ok((image, hashes))
                })
                .await
            }
            Err(e) => Err(e),
        };
        // Ok(rebuilt state) or Err(seq of the entry that failed).
        let mut snap_sum = 0;
        // A compacted delta applies to the snapshot, as hydrate applies it: keep a copy of
        // the snapshot's state when the chain has one.
        let compacts = chain
            .deltas
            .iter()
            .skip(1)
            .any(|e| matches!(e, LogEntry::Delta { base, .. } if *base == snap));
        let mut snapshot_state = None;
        let mut state = match fetched {
            Ok(v) => {
                report.ok.push(snap);
                snap_sum = v.1.sum();
                if compacts {
                    snapshot_state = Some(v.clone());
                }
                Ok(v)
            }
            Err(e) => {
                report.failed.push((snap, e));
                Err(snap)
            }
        };
        for entry in &chain.deltas {
            state = match state {
                Err(bad) => {
                    let why = broken(org, entry.seq(), format!("follows seq {bad}, which failed"));
                    report.failed.push((entry.seq(), why));
                    Err(bad)
                }
                Ok(current) => {
                    let (image, hashes) = match (&snapshot_state, entry) {
                        (Some(at_snapshot), LogEntry::Delta { base, .. }) if *base == snap => {
                            at_snapshot.clone()
                        }
                        _ => current,
                    };
                    let applied = match self.fetch(org, entry).await {
                        Ok((obj, body)) => {
                            let (org, entry) = (org.clone(), entry.clone());
                            blocking("applying a delta", move || {
                                let (mut image, mut hashes) = (image, hashes);
                                let snapshot = (snap, snap_sum);
                                apply_delta(
                                    &org,
                                    snapshot,
                                    &entry,
                                    &obj,
                                    &body,
                                    &mut image,
                                    &mut hashes,
                                )?;
                                Ok((image, hashes))
                            })
                            .await
                        }
                        Err(e) => Err(e),
                    };
                    match applied {
                        Ok(state) => {
                            report.ok.push(entry.seq());
                            Ok(state)
                        }
                        Err(e) => {
                            report.failed.push((entry.seq(), e));
                            Err(entry.seq())
                        }
                    }
                }
            };
        }
        if let (Ok((image, _)), Some(last)) = (state, chain.deltas.last()) {
            let object = format!("{org}@{}", last.seq());
            let checked = blocking("checking a rebuilt database", move || {
                integrity_check_image(&object, &image)
            })
            .await;
            if let Err(e) = checked {
                report.ok.retain(|s| *s != last.seq());
                report.failed.push((last.seq(), e));
            }
        }
    }

    fn shipped(&self, org: &OrgId, entry: &LogEntry) -> Option<Shipped> {
        Shipped::from_entry(entry, |b| self.inner.layout.blob(org, b).to_string())
    }

    /// Downloads a snapshot's or delta's blob and returns its verified uncompressed bytes.
    async fn fetch(&self, org: &OrgId, entry: &LogEntry) -> Result<(String, Vec<u8>), Error> {
        let (LogEntry::Snapshot {
            blob,
            bytes,
            sha256,
            ..
        }
        | LogEntry::Delta {
            blob,
            bytes,
            sha256,
            ..
        }) = entry
        else {
            return Err(Error::NoSuchSnapshot {
                org: org.to_string(),
                seq: entry.seq(),
            });
        };
        let path = self.inner.layout.blob(org, blob);
        let object = path.to_string();
        let data = self
            .get_bytes(&path)
            .await?
            .ok_or_else(|| Error::MissingObject {
                path: object.clone(),
            })?;
        self.failpoint(FailPoint::HydrateAfterDownload, org).await?;
        let (bytes, sha256, obj) = (*bytes, sha256.clone(), object.clone());
        let out = blocking("decompressing a blob", move || {
            unpack(&obj, &data, bytes, &sha256)
        })
        .await?;
        Ok((object, out))
    }

    /// Fetches the blobs of `entries`, `n` at a time, in order.
    async fn fetch_batch(
        &self,
        org: &OrgId,
        entries: &[LogEntry],
        n: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, Error> {
        // Collected first: a stream over a closure taking `&LogEntry` makes the future's
        // `Send` bound higher-ranked, which callers' `tokio::spawn` cannot prove.
        let fetches: Vec<_> = entries.iter().map(|e| self.fetch(org, e)).collect();
        futures::stream::iter(fetches)
            .buffered(n)
            .try_collect()
            .await
    }

    /// Rebuilds the image of a chain: the snapshot, then each delta after checking the
    /// database checksum before it and after it. Blobs are fetched concurrently.
    async fn rebuild(&self, org: &OrgId, chain: &Chain) -> Result<(Vec<u8>, String), Error> {
        let (object, image) = self.fetch(org, &chain.snapshot).await?;
        let n = self.inner.settings.read_concurrency.max(1);
        let mut state = blocking("hashing a snapshot", move || {
            let hashes = PageHashes::of_image(&object, &image)?;
            Ok((image, hashes))
        })
        .await?;
        // Deltas are fetched `n` at a time (download, decompress, sha256), and each batch is
        // applied in order while exactly the next one is fetched: memory holds the image and
        // at most two batches of bodies. An apply error returns at once (the fetch is
        // dropped); when both fail, the apply's error, earlier in the chain, wins.
        let snapshot = (chain.snapshot.seq(), state.1.sum());
        let mut batches = chain.deltas.chunks(n);
        let mut next = match batches.next() {
            Some(entries) => Some((entries, self.fetch_batch(org, entries, n).await?)),
            None => None,
        };
        while let Some((entries, bodies)) = next {
            let batch: Vec<(LogEntry, (String, Vec<u8>))> =
                entries.iter().cloned().zip(bodies).collect();
            let org_id = org.clone();
            let applying = blocking("applying deltas", move || {
                let (mut image, mut hashes) = state;
                for (entry, (obj, body)) in &batch {
                    apply_delta(&org_id, snapshot, entry, obj, body, &mut image, &mut hashes)?;
                }
                Ok((image, hashes))
            });
            let Some(following) = batches.next() else {
                state = applying.await?;
                break;
            };
            let applying = std::pin::pin!(applying);
            let fetching = std::pin::pin!(self.fetch_batch(org, following, n));
            next = match futures::future::select(applying, fetching).await {
                Either::Left((applied, fetching)) => {
                    state = applied?;
                    Some((following, fetching.await?))
                }
                Either::Right((fetched, applying)) => {
                    state = applying.await?;
                    Some((following, fetched?))
                }
            };
        }
        Ok((state.0, format!("{org}@{}", chain.position())))
    }

    async fn install_chain(
        &self,
        org: &OrgId,
        chain: Option<Chain>,
        dest: &Path,
    ) -> Result<Hydrated, Error> {
        let dest_buf = dest.to_path_buf();
        let Some(chain) = chain else {
            blocking("clearing the destination", move || remove_db(&dest_buf)).await?;
            info!(%org, "hydrated empty: no snapshot published yet");
            return Ok(Hydrated {
                snapshot: None,
                commit: 0,
                position: None,
                deltas: 0,
            });
        };
        let (image, object) = self.rebuild(org, &chain).await?;
        let nonce = new_nonce()?;
        blocking("installing a snapshot", move || {
            install(&object, &image, &dest_buf, &nonce)
        })
        .await?;
        let last = chain.deltas.last().unwrap_or(&chain.snapshot);
        let commit = last.commit().unwrap_or(0);
        let position = Some(last.seq());
        info!(%org, seq = chain.snapshot.seq(), position, deltas = chain.deltas.len(),
              round = chain.snapshot.round(), commit, "hydrated");
        Ok(Hydrated {
            snapshot: self.shipped(org, &chain.snapshot),
            commit,
            position,
            deltas: chain.deltas.len(),
        })
    }
}

/// Every delta after `snapshot` in `rest` on its chain (same round, contiguous, each based on
/// the previous entry or, compacted, on the snapshot), stopping at the first that is not.
pub(crate) fn chain_after(rest: &[LogEntry], snapshot: &LogEntry) -> Vec<LogEntry> {
    let mut tip = snapshot.seq();
    let mut out = Vec::new();
    for e in rest {
        match e {
            LogEntry::Delta { base, .. }
                if (*base == tip || *base == snapshot.seq())
                    && e.round() == snapshot.round()
                    && e.seq() == tip + 1 =>
            {
                tip = e.seq();
                out.push(e.clone());
            }
            _ => break,
        }
    }
    out
}

/// Checks a delta against its entry and the running checksum, then applies it. `snapshot`
/// is the chain's snapshot (seq, checksum): a compacted delta must start from it, and applied
/// to any later state of the chain it gives the same database as applied to the snapshot,
/// because it carries every page changed since.
fn apply_delta(
    org: &OrgId,
    snapshot: (u64, u64),
    entry: &LogEntry,
    object: &str,
    body: &[u8],
    image: &mut Vec<u8>,
    hashes: &mut PageHashes,
) -> Result<(), Error> {
    let LogEntry::Delta {
        seq,
        base,
        base_checksum,
        checksum,
        page_size,
        db_pages,
        changed_pages,
        ..
    } = entry
    else {
        return Err(broken(org, entry.seq(), "not a delta"));
    };
    let before = checksum_hex(if *base == snapshot.0 {
        snapshot.1
    } else {
        hashes.sum()
    });
    if before != *base_checksum {
        return Err(broken(
            org,
            *seq,
            format!(
                "database checksum before the delta is {before}, the delta expects {base_checksum}"
            ),
        ));
    }
    let delta = DeltaBody::parse(object, body)?;
    if delta.page_size() != *page_size
        || delta.db_pages() != *db_pages
        || delta.changed_pages() != *changed_pages as usize
        || delta.page_size() != hashes.page_size()
    {
        return Err(crate::entry::corrupt(
            object,
            "delta body does not match its log entry",
        ));
    }
    delta.apply(image, hashes)?;
    let after = checksum_hex(hashes.sum());
    if after != *checksum {
        return Err(broken(
            org,
            *seq,
            format!("database checksum after the delta is {after}, the log says {checksum}"),
        ));
    }
    Ok(())
}
