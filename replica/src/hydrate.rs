//! Hydrate, restore and verify: download a published snapshot, check it, install it (I8, I10).

use std::path::Path;

use tracing::info;

use crate::layout::new_nonce;
use crate::snapshot::{install, integrity_check_image, remove_db, unpack};
use crate::{Claim, Error, FailPoint, Hydrated, LogEntry, OrgId, Replica, Shipped, VerifyReport};

impl Replica {
    /// Installs at `dest` the latest snapshot published before `claim` (I8).
    ///
    /// Verifies size and sha256 of the uncompressed bytes and runs `quick_check` on a temp
    /// file in `dest`'s directory before renaming it into place and fsyncing the directory.
    /// Any existing file at `dest` (and its `-wal`/`-shm`/`-journal`) is replaced: the local
    /// file is a cache, never an authority. With no snapshot yet, `dest` is removed and
    /// nothing is created (`snapshot: None, commit: 0`). `dest` must not be open by anyone:
    /// name local files per claim.
    ///
    /// # Errors
    /// [`Error::MissingObject`]/[`Error::Corrupt`] when the latest snapshot cannot be
    /// installed; never falls back to an older one (I10). [`Error::Store`], [`Error::Io`].
    pub async fn hydrate(&self, claim: &Claim, dest: &Path) -> Result<Hydrated, Error> {
        let log = self.history(&claim.org).await?;
        let latest = log
            .into_iter()
            .rfind(|e| e.seq() < claim.seq && matches!(e, LogEntry::Snapshot { .. }));
        self.install_entry(&claim.org, latest, dest).await
    }

    /// Installs any published snapshot of `org` at `dest`: `at: None` = the latest, `Some(seq)`
    /// = the snapshot entry at that log position. Same checks and atomicity as [`Replica::hydrate`].
    ///
    /// # Errors
    /// As [`Replica::hydrate`]; [`Error::NoSuchSnapshot`] when `at` names no snapshot entry.
    pub async fn restore(
        &self,
        org: &OrgId,
        at: Option<u64>,
        dest: &Path,
    ) -> Result<Hydrated, Error> {
        let entry = match at {
            Some(seq) => match self.read_entry(org, seq).await? {
                Some(e @ LogEntry::Snapshot { .. }) => Some(e),
                _ => {
                    return Err(Error::NoSuchSnapshot {
                        org: org.to_string(),
                        seq,
                    });
                }
            },
            None => self
                .history(org)
                .await?
                .into_iter()
                .rfind(|e| matches!(e, LogEntry::Snapshot { .. })),
        };
        self.install_entry(org, entry, dest).await
    }

    /// Downloads and fully checks (size, sha256, `integrity_check`) every published snapshot.
    ///
    /// # Errors
    /// [`Error::Store`] or an unreadable log; per-snapshot failures go in the report.
    pub async fn verify(&self, org: &OrgId) -> Result<VerifyReport, Error> {
        let mut report = VerifyReport::default();
        for entry in self.history(org).await? {
            let seq = entry.seq();
            if !matches!(entry, LogEntry::Snapshot { .. }) {
                continue;
            }
            let checked = async {
                let (object, image) = self.fetch(org, &entry).await?;
                tokio::task::spawn_blocking(move || integrity_check_image(&object, &image))
                    .await
                    .map_err(|source| Error::Task {
                        op: "checking a snapshot",
                        source,
                    })?
            };
            match checked.await {
                Ok(()) => report.ok.push(seq),
                Err(e) => report.failed.push((seq, e)),
            }
        }
        Ok(report)
    }

    fn shipped(&self, org: &OrgId, entry: &LogEntry) -> Option<Shipped> {
        Shipped::from_entry(entry, |b| self.inner.layout.blob(org, b).to_string())
    }

    /// Downloads a snapshot's blob and returns its verified uncompressed image.
    async fn fetch(&self, org: &OrgId, entry: &LogEntry) -> Result<(String, Vec<u8>), Error> {
        let LogEntry::Snapshot {
            blob,
            bytes,
            sha256,
            ..
        } = entry
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
        let image = tokio::task::spawn_blocking(move || unpack(&obj, &data, bytes, &sha256))
            .await
            .map_err(|source| Error::Task {
                op: "decompressing a snapshot",
                source,
            })??;
        Ok((object, image))
    }

    async fn install_entry(
        &self,
        org: &OrgId,
        entry: Option<LogEntry>,
        dest: &Path,
    ) -> Result<Hydrated, Error> {
        let dest_buf = dest.to_path_buf();
        let Some(entry) = entry else {
            tokio::task::spawn_blocking(move || remove_db(&dest_buf))
                .await
                .map_err(|source| Error::Task {
                    op: "clearing the destination",
                    source,
                })??;
            info!(%org, "hydrated empty: no snapshot published yet");
            return Ok(Hydrated {
                snapshot: None,
                commit: 0,
            });
        };
        let (object, image) = self.fetch(org, &entry).await?;
        let nonce = new_nonce()?;
        tokio::task::spawn_blocking(move || install(&object, &image, &dest_buf, &nonce))
            .await
            .map_err(|source| Error::Task {
                op: "installing a snapshot",
                source,
            })??;
        let snapshot = self.shipped(org, &entry);
        let commit = snapshot.as_ref().map(|s| s.commit).unwrap_or(0);
        info!(%org, seq = entry.seq(), round = entry.round(), commit, "hydrated");
        Ok(Hydrated { snapshot, commit })
    }
}
