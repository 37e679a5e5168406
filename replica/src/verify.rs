//! Verify: download and check every snapshot and every delta of an org, replaying each
//! snapshot's chain as hydrate would (I10), and report what fails instead of stopping.

use tracing::debug;

use crate::chain::{self, Chain, Start, broken};
use crate::format::checksum::PageHashes;
use crate::format::layout::new_nonce;
use crate::rebuild::check::integrity_check_file;
use crate::rebuild::image::FileImage;
use crate::replica::blocking;
use crate::{Error, LogEntry, OrgId, Replica};

/// Result of [`crate::Replica::verify`].
#[derive(Debug, Default)]
pub struct VerifyReport {
    /// Log positions of snapshots that passed sha256, size and `integrity_check`, and of
    /// deltas whose chain from their snapshot rebuilt the checksummed database.
    pub ok: Vec<u64>,
    /// Snapshots and deltas that failed, with why.
    pub failed: Vec<(u64, crate::Error)>,
}

impl Replica {
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
                // The journal's reader reads both formats (seq 0 is a journal walk's state).
                if *seq > 0
                    && self
                        .inner
                        .log
                        .read_journal_entry(org, *seq)
                        .await?
                        .is_none()
                {
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

    /// One pass of [`Replica::verify`] over the log as it is now.
    async fn verify_once(&self, org: &OrgId) -> Result<VerifyReport, Error> {
        let log = match self.history(org).await {
            Err(Error::JournalRequired { .. }) => return self.verify_journal(org).await,
            other => other?,
        };
        let mut report = VerifyReport::default();
        let mut reached = std::collections::HashSet::new();
        for (i, entry) in log.iter().enumerate() {
            if !entry.is_snapshot() {
                continue;
            }
            let chain = Chain {
                snapshot: entry.clone(),
                deltas: chain::after(entry, &log[i + 1..]),
            };
            reached.extend(chain.deltas.iter().map(LogEntry::seq));
            reached.extend(chain::strays(entry, &log[i + 1..]));
            self.verify_chain(org, &chain, &mut report).await;
        }
        // Level files hold the positions retention thinned out of closed chains (2d).
        self.verify_levels(org, &log, &mut report).await?;
        for e in log.iter().filter(|e| e.is_delta()) {
            if !reached.contains(&e.seq()) {
                let why = broken(org, e.seq(), "delta is not on the chain of any snapshot");
                report.failed.push((e.seq(), why));
            }
        }
        report.ok.sort_unstable();
        report.ok.dedup();
        Ok(report)
    }

    /// Checks a snapshot, then each delta of its chain in order, reporting the first entry
    /// that fails and every delta after it (they cannot be rebuilt). The image is rebuilt
    /// in a temp file, so memory does not grow with the database.
    async fn verify_chain(&self, org: &OrgId, chain: &Chain, report: &mut VerifyReport) {
        let snap = chain.snapshot.seq();
        let dir = match scratch() {
            Ok(d) => d,
            Err(e) => {
                report.failed.push((snap, e));
                return;
            }
        };
        let fetched = self
            .snapshot_into(org, &chain.snapshot, &dir, "snapshot")
            .await;
        // A compacted delta applies to the snapshot, as hydrate applies it: it gets a copy
        // of the snapshot's state, downloaded again when it comes.
        let mut state = match fetched {
            Ok(v) => {
                report.ok.push(snap);
                Ok(v)
            }
            Err(e) => {
                report.failed.push((snap, e));
                Err(snap)
            }
        };
        let snap_sum = state.as_ref().map_or(0, |(_, h)| h.sum());
        let start = Start {
            seq: snap,
            checksum: snap_sum,
        };
        // The position the running state is at.
        let mut at = snap;
        for entry in &chain.deltas {
            state = match state {
                Err(bad) => {
                    let why = broken(org, entry.seq(), format!("follows seq {bad}, which failed"));
                    report.failed.push((entry.seq(), why));
                    Err(bad)
                }
                Ok(current) => {
                    let link_base = entry.delta().map_or(at, |d| d.base);
                    // A pipelined delta applies to the position its writer had seen land,
                    // which may be any earlier one: that state is rebuilt for it.
                    let base = if entry.is_pipelined() && link_base != at {
                        current.0.remove();
                        self.rebuild_at(org, chain, link_base, &dir, start).await
                    } else if chain::compacts(&chain.snapshot, entry)
                        && chain.deltas.first().map(LogEntry::seq) != Some(entry.seq())
                    {
                        current.0.remove();
                        self.snapshot_into(org, &chain.snapshot, &dir, "compaction")
                            .await
                    } else {
                        Ok(current)
                    };
                    let applied = match base {
                        Ok(base) => self.verify_delta(org, start, entry, base).await,
                        Err(e) => Err(e),
                    };
                    match applied {
                        Ok(state) => {
                            report.ok.push(entry.seq());
                            at = entry.seq();
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
        if let (Ok((mut image, _)), Some(last)) = (state, chain.deltas.last()) {
            let object = format!("{org}@{}", last.seq());
            let checked = blocking("checking a rebuilt database", move || {
                image.sync()?;
                integrity_check_file(&object, image.path())
            })
            .await;
            if let Err(e) = checked {
                report.ok.retain(|s| *s != last.seq());
                report.failed.push((last.seq(), e));
            }
        }
    }

    /// Downloads the snapshot `entry` into a new file `name` in `dir` and runs
    /// `integrity_check` on it.
    async fn snapshot_into(
        &self,
        org: &OrgId,
        entry: &LogEntry,
        dir: &tempfile::TempDir,
        name: &str,
    ) -> Result<(FileImage, PageHashes), Error> {
        let path = dir.path().join(format!("{name}-{}", new_nonce()?));
        let file = blocking("creating a scratch file", move || FileImage::create(&path)).await?;
        let (file, object, hashes, _) = self.download_snapshot(org, entry, file, true).await?;
        let mut file = file;
        blocking("checking a snapshot", move || {
            file.sync()?;
            integrity_check_file(&object, file.path())?;
            Ok((file, hashes))
        })
        .await
    }

    /// The state of `chain` at its position `seq`: the snapshot downloaded again into `dir`
    /// and the deltas from it to `seq` applied in order, each one's base the one before.
    ///
    /// # Errors
    /// [`Error::ChainBroken`] when `seq` is no position of the chain; the download's and the
    /// deltas' errors.
    async fn rebuild_at(
        &self,
        org: &OrgId,
        chain: &Chain,
        seq: u64,
        dir: &tempfile::TempDir,
        start: Start,
    ) -> Result<(FileImage, PageHashes), Error> {
        let mut path = Vec::new();
        let mut at = seq;
        while at != chain.snapshot.seq() {
            let Some(d) = chain.deltas.iter().find(|d| d.seq() == at) else {
                return Err(broken(org, seq, "base is no position of the chain"));
            };
            path.push(d);
            // Bases are below their deltas (the chain walk), so this ends.
            at = d.delta().map_or(chain.snapshot.seq(), |l| l.base);
        }
        let mut state = self
            .snapshot_into(org, &chain.snapshot, dir, "rebuild")
            .await?;
        for d in path.into_iter().rev() {
            state = self.verify_delta(org, start, d, state).await?;
        }
        Ok(state)
    }

    /// Fetches the delta `entry` and applies it to `base`, checking its checksums.
    async fn verify_delta(
        &self,
        org: &OrgId,
        start: Start,
        entry: &LogEntry,
        base: (FileImage, PageHashes),
    ) -> Result<(FileImage, PageHashes), Error> {
        let (obj, body) = self.fetch(org, entry).await?;
        let (org, entry) = (org.clone(), entry.clone());
        blocking("applying a delta", move || {
            let (mut image, mut hashes) = base;
            chain::apply(&org, start, &entry, &obj, &body, &mut image, &mut hashes)?;
            Ok((image, hashes))
        })
        .await
    }
}

impl Replica {
    /// [`Replica::verify`] of an org whose log uses the journal (`docs/design.md` 3g): every
    /// snapshot and delta entry rebuilt by its base links, each delta checked against the
    /// checksums before and after it; then the walk's newest state (its section applied
    /// to its base and checked, I10). The walk's state is reported as failed at seq 0.
    async fn verify_journal(&self, org: &OrgId) -> Result<VerifyReport, Error> {
        let log = self.inner.log.journal_history(org).await?;
        let dir = scratch()?;
        let mut report = VerifyReport::default();
        for e in log.iter().filter(|e| e.stored().is_some()) {
            let dest = dir.path().join(format!("{}-{}", e.seq(), new_nonce()?));
            match self.restore_entry(org, e.seq(), &dest).await {
                Ok(_) => report.ok.push(e.seq()),
                Err(err) => report.failed.push((e.seq(), err)),
            }
        }
        let dest = dir.path().join(format!("walk-{}", new_nonce()?));
        let walked = match self.walk_org(org).await {
            Ok(walk) => self.restore_walk(org, &walk, &dest).await.map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = walked {
            report.failed.push((0, e));
        }
        Ok(report)
    }
}

/// A scratch directory for rebuilt images, removed when dropped.
fn scratch() -> Result<tempfile::TempDir, Error> {
    tempfile::Builder::new()
        .prefix("idem-verify-")
        .tempdir()
        .map_err(|e| Error::io(&std::env::temp_dir(), e))
}
