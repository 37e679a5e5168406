//! Restoring a position of a closed chain through its level file: the snapshot, the sections
//! up to the position, then the deltas after the last section that are still kept.

use crate::chain::{self, Start, broken};
use crate::format::body::DeltaBody;
use crate::format::checksum::{PageHashes, checksum_hex};
use crate::format::layout::new_nonce;
use crate::format::level::LevelFile;
use crate::live::Durability;
use crate::rebuild::hydrate::Hydrated;
use crate::rebuild::image::FileImage;
use crate::rebuild::install::{Check, discard, install_file, temp_beside};
use crate::replica::blocking;
use crate::{Error, LogEntry, OrgId, Replica};

/// How a position of a closed chain is rebuilt from its level file.
pub(crate) struct LevelPlan {
    pub(crate) snapshot: LogEntry,
    pub(crate) file: LevelFile,
    /// Sections applied: `0..sections`.
    pub(crate) sections: usize,
    /// Kept deltas after the last section applied, up to the position.
    pub(crate) tail: Vec<LogEntry>,
    pub(crate) position: u64,
    /// The commit counter at the position.
    pub(crate) commit: u64,
}

impl Replica {
    /// The plan that rebuilds `seq` of `org` through a level file, when `seq` lies in a
    /// closed chain that has one (after its snapshot, at or before its end): `None`
    /// otherwise, and the position is read from the log alone.
    ///
    /// # Errors
    /// [`Error::PositionNotKept`] when `seq` is neither a section of the file nor a delta
    /// the log still holds (retention kept only its bucket's last position), naming the
    /// kept positions around it; the level file's read errors.
    pub(crate) async fn level_plan(
        &self,
        org: &OrgId,
        log: &[LogEntry],
        seq: u64,
    ) -> Result<Option<LevelPlan>, Error> {
        let Some(i) = log.iter().rposition(|e| e.is_snapshot() && e.seq() <= seq) else {
            return Ok(None);
        };
        let snapshot = &log[i];
        // A snapshot, or an entry that is no position (a claim, a release): the log answers.
        let not_a_position = log
            .iter()
            .any(|e| e.seq() == seq && !(e.is_delta() || e.is_snapshot()));
        if snapshot.seq() == seq || not_a_position {
            return Ok(None);
        }
        let levels = self.level_names(org).await?;
        let Some(level) = levels
            .iter()
            .find(|l| l.snapshot == snapshot.seq() && seq <= l.end)
        else {
            return Ok(None);
        };
        let file = self.read_level(org, level).await?;
        let sections = &file.header.sections;
        let (upto, tail) = if log.iter().any(|e| e.seq() == seq && e.is_delta()) {
            // The log still holds the position: its path from the snapshot (from the newest
            // compaction on), shortened by the newest section on that path.
            let Some(path) = chain::newest(org, log, seq.saturating_add(1))?
                .filter(|c| c.position() == seq && c.snapshot.seq() == snapshot.seq())
            else {
                return Ok(None);
            };
            let on_path = |s: u64| path.deltas.iter().any(|d| d.seq() == s);
            let Some(k) = sections
                .iter()
                .rposition(|s| s.seq <= seq && on_path(s.seq))
            else {
                return Ok(None);
            };
            let from = sections[k].seq;
            let tail: Vec<LogEntry> = path.deltas.into_iter().filter(|d| d.seq() > from).collect();
            (k + 1, tail)
        } else {
            // Thinned out of the log: only a section stands for it.
            let Some(k) = sections.iter().position(|s| s.seq == seq) else {
                let k = sections.iter().take_while(|s| s.seq < seq).count();
                return Err(Error::PositionNotKept {
                    org: org.to_string(),
                    seq,
                    before: Some(k.checked_sub(1).map_or(snapshot.seq(), |k| sections[k].seq)),
                    after: sections.get(k).map(|s| s.seq),
                });
            };
            (k + 1, Vec::new())
        };
        let sections = upto;
        let commit = match tail.last() {
            Some(e) => e.commit().unwrap_or(0),
            None => sections
                .checked_sub(1)
                .map_or(0, |k| file.header.sections[k].commit),
        };
        Ok(Some(LevelPlan {
            snapshot: snapshot.clone(),
            file,
            sections,
            tail,
            position: seq,
            commit,
        }))
    }

    /// Rebuilds `plan` in a temp file beside `dest`, with every check of a hydrate (the
    /// snapshot's digests, the database checksum before and after each section and delta),
    /// and installs it at `dest` only if all pass (I10).
    ///
    /// # Errors
    /// [`Error::ChainBroken`] when a checksum does not match; [`Error::Corrupt`]; the
    /// download's errors. Nothing is installed on any error.
    pub(crate) async fn install_level_plan(
        &self,
        org: &OrgId,
        plan: LevelPlan,
        dest: &std::path::Path,
    ) -> Result<Hydrated, Error> {
        let tmp = temp_beside(dest, &new_nonce()?)?;
        let t = tmp.clone();
        let built = async {
            let file = blocking("creating a temp file", move || FileImage::create(&t)).await?;
            let (image, _, hashes, _) = self
                .download_snapshot(org, &plan.snapshot, file, false)
                .await?;
            let start = Start {
                seq: plan.snapshot.seq(),
                checksum: hashes.sum(),
            };
            let org_id = org.clone();
            let (file, upto) = (plan.file, plan.sections);
            let (mut image, mut hashes) = blocking("applying level sections", move || {
                let (mut image, mut hashes) = (image, hashes);
                apply_sections(&org_id, &file, upto, &mut image, &mut hashes)?;
                Ok((image, hashes))
            })
            .await?;
            let n = self.inner.settings.read_concurrency.max(1);
            for batch in plan.tail.chunks(n) {
                let bodies = self.fetch_batch(org, batch, n).await?;
                let (org_id, batch) = (org.clone(), batch.to_vec());
                (image, hashes) = blocking("applying deltas", move || {
                    let (mut image, mut hashes) = (image, hashes);
                    for (entry, (obj, body)) in batch.iter().zip(&bodies) {
                        chain::apply(&org_id, start, entry, obj, body, &mut image, &mut hashes)?;
                    }
                    Ok((image, hashes))
                })
                .await?;
            }
            let object = format!("{org}@{}", plan.position);
            let (t, d) = (tmp.clone(), dest.to_path_buf());
            blocking("installing a restored position", move || {
                image.sync()?;
                install_file(&object, &t, &d, Durability::Synced, Check::Now)
            })
            .await
        }
        .await;
        if let Err(e) = built {
            let t = tmp.clone();
            let _ = blocking("removing a temp file", move || {
                discard(&t);
                Ok(())
            })
            .await;
            return Err(e);
        }
        Ok(Hydrated {
            snapshot: self.shipped(org, &plan.snapshot),
            commit: plan.commit,
            position: Some(plan.position),
            deltas: plan.sections + plan.tail.len(),
        })
    }

    /// The newest position of `org` at or before the moment `at_ms` that a level file
    /// holds above `best` (a position on the log's chains): the last section at or before
    /// the moment of the closed chain `best` lies in. One LIST and at most one GET.
    pub(crate) async fn level_position_at(
        &self,
        org: &OrgId,
        best: u64,
        at_ms: u64,
    ) -> Result<Option<u64>, Error> {
        let levels = self.level_names(org).await?;
        let Some(level) = levels.iter().find(|l| l.snapshot <= best && best < l.end) else {
            return Ok(None);
        };
        let file = self.read_level(org, level).await?;
        Ok(file
            .header
            .sections
            .iter()
            .filter(|s| s.seq > best && s.at_ms <= at_ms)
            .map(|s| s.seq)
            .max())
    }
}

/// Applies sections `0..upto` of `file` to `image`, checking the snapshot's checksum first
/// and each section's before and after (I10).
pub(crate) fn apply_sections(
    org: &OrgId,
    file: &LevelFile,
    upto: usize,
    image: &mut FileImage,
    hashes: &mut PageHashes,
) -> Result<(), Error> {
    if checksum_hex(hashes.sum()) != file.header.snapshot_checksum {
        return Err(broken(
            org,
            file.header.snapshot,
            "snapshot checksum differs from its level file's",
        ));
    }
    for i in 0..upto.min(file.header.sections.len()) {
        let body = file.body(i)?;
        apply_section(org, file, i, &body, image, hashes)?;
    }
    Ok(())
}

/// Applies section `i` of `file` (its body `body`, read with [`LevelFile::body`]) to
/// `image`, checking the database checksum before and after it (I10).
///
/// # Errors
/// [`Error::ChainBroken`] when a checksum differs; [`Error::Corrupt`] for a body that does
/// not match its header or does not apply.
pub(crate) fn apply_section(
    org: &OrgId,
    file: &LevelFile,
    i: usize,
    body: &[u8],
    image: &mut dyn crate::rebuild::image::PageImage,
    hashes: &mut PageHashes,
) -> Result<(), Error> {
    let Some(s) = file.header.sections.get(i) else {
        return Err(Error::corrupt(&file.object, "no such level section"));
    };
    let before = checksum_hex(hashes.sum());
    if before != s.base_checksum {
        return Err(broken(
            org,
            s.seq,
            format!(
                "database checksum before the level section is {before}, it expects {}",
                s.base_checksum
            ),
        ));
    }
    let delta = DeltaBody::parse(&file.object, body)?;
    if delta.page_size() != file.header.page_size
        || delta.db_pages() != s.db_pages
        || delta.changed_pages() != s.changed_pages as usize
    {
        return Err(Error::corrupt(
            &file.object,
            "level section does not match its header",
        ));
    }
    delta.apply(image, hashes)?;
    let after = checksum_hex(hashes.sum());
    if after != s.checksum {
        return Err(broken(
            org,
            s.seq,
            format!(
                "database checksum after the level section is {after}, it says {}",
                s.checksum
            ),
        ));
    }
    Ok(())
}
