//! Retention: delete old snapshots, entries and orphan blobs, never what a reader needs to
//! reach the newest snapshot (I11).

use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use tracing::info;

use crate::chain;
use crate::layout::parse_blob_seq;
use crate::{Error, LogEntry, OrgId, Replica, Retention};

/// Result of [`crate::Replica::retain`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RetentionReport {
    /// Log positions deleted.
    pub deleted_entries: Vec<u64>,
    /// Blob object paths deleted (expired snapshots and orphans).
    pub deleted_blobs: Vec<String>,
    /// Snapshot entries kept.
    pub kept_snapshots: usize,
}

impl Replica {
    /// Applies `policy` to `org`.
    ///
    /// Never deletes the newest snapshot entry, its blob, or any entry after it (its delta
    /// chain), nor any claim or release entry (so no slot a zombie writer would publish into
    /// is ever freed). Deletes older snapshot entries (and then their blobs) that are beyond
    /// `keep_snapshots` AND older than `keep_ms`, with the deltas chained to them; deltas
    /// below the newest snapshot that no kept snapshot's chain reaches; and orphan
    /// blobs (named by no log entry) whose seq is at most the head seq — a blob above the
    /// head may belong to a ship in flight (a zombie's uploaded blob is an orphan: its entry
    /// can never land).
    ///
    /// Reads only the log entries this handle has not published or read before (checked
    /// against the listing's size and ETag; see [`crate::Settings::known_entries`]).
    ///
    /// # Errors
    /// [`Error::Store`]; an unreadable log. A partial run is safe to repeat.
    pub async fn retain(&self, org: &OrgId, policy: &Retention) -> Result<RetentionReport, Error> {
        self.writable("retention")?;
        // Entries this handle published or read before are not read again: a run costs two
        // LISTs, a GET per entry it has not seen, and its deletions (I14).
        let (log, listed) = self.history_known(org).await?;
        let mut report = RetentionReport::default();
        let Some(head) = log.last().map(LogEntry::seq) else {
            return Ok(report);
        };
        let snaps: Vec<&LogEntry> = log.iter().filter(|e| e.is_snapshot()).collect();
        let Some(newest) = snaps.last().map(|e| e.seq()) else {
            return Ok(report);
        };
        let now = self.inner.clock.now_ms();
        let keep = policy.keep_snapshots.max(1);
        let mut doomed: Vec<&LogEntry> = Vec::new();
        for (i, e) in snaps.iter().enumerate() {
            let beyond_count = i + keep < snaps.len();
            let old_enough = now.saturating_sub(e.at_ms()) >= policy.keep_ms;
            if beyond_count && old_enough && e.seq() < newest {
                doomed.push(e);
            }
        }
        // Deltas stay while the snapshot they chain from stays (point-in-time restore);
        // deltas no kept snapshot reaches (a fenced writer's orphans) go. Claims and releases
        // always stay: the entry after any writer's last entry is its own release or the next
        // writer's claim, so keeping them means no slot a zombie writer would publish into is
        // ever freed, and a zombie's create always collides (I7, I11). They cost one entry per
        // handoff.
        let mut reachable = std::collections::HashSet::new();
        for (i, e) in log.iter().enumerate() {
            if e.is_snapshot() && !doomed.iter().any(|d| d.seq() == e.seq()) {
                reachable.extend(chain::after(e, &log[i + 1..]).iter().map(LogEntry::seq));
            }
        }
        doomed.extend(
            log.iter()
                .filter(|e| e.is_delta() && e.seq() < newest && !reachable.contains(&e.seq())),
        );
        report.kept_snapshots = snaps.len() - doomed.iter().filter(|e| e.is_snapshot()).count();
        // Entries first, then blobs: a reader never finds an entry whose blob is gone. Deltas
        // go newest first and before their snapshot, so an interrupted run leaves a snapshot
        // with a prefix of its chain, never deltas without their snapshot.
        doomed.sort_by_key(|e| (e.is_snapshot(), std::cmp::Reverse(e.seq())));
        for e in &doomed {
            let path = self.inner.layout.log(org, e.seq());
            self.delete(&path).await?;
            report.deleted_entries.push(e.seq());
        }
        report.deleted_entries.sort_unstable();
        self.inner
            .known
            .forget(org, &report.deleted_entries, &listed);
        let referenced: std::collections::HashSet<&str> = log
            .iter()
            .filter(|e| !doomed.iter().any(|d| d.seq() == e.seq()))
            .filter_map(LogEntry::blob)
            .collect();
        let dir = self.inner.layout.snap_dir(org);
        let blobs: Vec<_> = self
            .inner
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| Error::store("list", &dir, e))?;
        for meta in blobs {
            let Some(name) = meta.location.filename() else {
                continue;
            };
            if referenced.contains(name) {
                continue;
            }
            match parse_blob_seq(name) {
                Some(seq) if seq <= head => {}
                _ => continue,
            }
            self.delete(&meta.location).await?;
            report.deleted_blobs.push(meta.location.to_string());
        }
        info!(%org, entries = report.deleted_entries.len(), blobs = report.deleted_blobs.len(), "retention ran");
        Ok(report)
    }

    /// Deletes the object at `path`; an object already gone is fine (a repeated run).
    async fn delete(&self, path: &object_store::path::Path) -> Result<(), Error> {
        match self.inner.store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::store("delete", path, e)),
        }
    }
}
