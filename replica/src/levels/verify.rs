//! Verify's pass over level files: each one rebuilt on its snapshot, every section checked.

use crate::format::checksum::checksum_hex;
use crate::format::layout::new_nonce;
use crate::levels::LevelName;
use crate::rebuild::check::integrity_check_file;
use crate::rebuild::image::FileImage;
use crate::replica::blocking;
use crate::verify::VerifyReport;
use crate::{Error, LogEntry, OrgId, Replica};

impl Replica {
    /// Checks every level file of `org` whose snapshot `log` holds: the snapshot
    /// downloaded, every section applied with its checksums before and after (I10), the
    /// result through `integrity_check`, and each section's checksum equal to the log's
    /// delta at its seq where the log still holds it. Passing sections go in `report.ok`; a
    /// failure is reported at the file's snapshot seq. A file whose snapshot is gone is
    /// retention's to delete and no reader plans through it: not checked.
    ///
    /// # Errors
    /// [`Error::Store`] listing the level files; everything else goes in the report.
    pub(crate) async fn verify_levels(
        &self,
        org: &OrgId,
        log: &[LogEntry],
        report: &mut VerifyReport,
    ) -> Result<(), Error> {
        for level in self.level_names(org).await? {
            let Some(snapshot) = log
                .iter()
                .find(|e| e.is_snapshot() && e.seq() == level.snapshot)
            else {
                continue;
            };
            match self.verify_level(org, snapshot, &level, log).await {
                Ok(seqs) => report.ok.extend(seqs),
                Err(e) => report.failed.push((level.snapshot, e)),
            }
        }
        Ok(())
    }

    async fn verify_level(
        &self,
        org: &OrgId,
        snapshot: &LogEntry,
        level: &LevelName,
        log: &[LogEntry],
    ) -> Result<Vec<u64>, Error> {
        let file = self.read_level(org, level).await?;
        for s in &file.header.sections {
            let logged = log
                .iter()
                .find(|e| e.seq() == s.seq)
                .and_then(LogEntry::delta);
            if let Some(d) = logged.filter(|d| d.checksum != s.checksum) {
                return Err(crate::chain::broken(
                    org,
                    s.seq,
                    format!(
                        "level section checksum {} differs from the log's {}",
                        s.checksum, d.checksum
                    ),
                ));
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("idem-verify-")
            .tempdir()
            .map_err(|e| Error::io(&std::env::temp_dir(), e))?;
        let path = dir.path().join(format!("level-{}", new_nonce()?));
        let image = blocking("creating a scratch file", move || FileImage::create(&path)).await?;
        let (image, _, hashes, _) = self.download_snapshot(org, snapshot, image, false).await?;
        let (org_id, object) = (org.clone(), format!("{org}@{}", level.end));
        blocking("checking a level file", move || {
            let (mut image, mut hashes) = (image, hashes);
            let n = file.header.sections.len();
            super::restore::apply_sections(&org_id, &file, n, &mut image, &mut hashes)?;
            debug_assert_eq!(
                Some(checksum_hex(hashes.sum())),
                file.header.sections.last().map(|s| s.checksum.clone())
            );
            image.sync()?;
            integrity_check_file(&object, image.path())?;
            Ok(file.header.sections.iter().map(|s| s.seq).collect())
        })
        .await
    }
}
