//! A walk's state installed as a database (`docs/design.md` 3g, "Readers"): a log entry's
//! state (a checkpoint, or a per-org chain's position), or the newest section read applied
//! to the base it names, nothing else.
//!
//! A log position is rebuilt by following its entry's `base` links down to a snapshot, each
//! delta checked against the checksum before and after it (I10): the links name exactly the
//! entries the writer built on, whatever else the log holds. A section's base must have the
//! checksum the section names, then the section's pages are applied and the result must
//! have the section's checksum. The file is built beside `dest` and renamed over it only
//! when every check passed.

use std::collections::BTreeMap;
use std::path::Path;

use crate::chain::{self, Chain};
use crate::format::body::DeltaBody;
use crate::format::checksum::{PageHashes, checksum_hex};
use crate::format::layout::new_nonce;
use crate::journal::SectionIndex;
use crate::journal::io::Listed;
use crate::journal::org_walk::{OrgWalk, WalkState};
use crate::live::Durability;
use crate::rebuild::image::FileImage;
use crate::rebuild::install::{Check, discard, install_file, temp_beside};
use crate::replica::blocking;
use crate::{Error, Hydrated, LogEntry, OrgId, Replica};

impl Replica {
    /// Installs at `dest` the state `walk` found for `org` ([`Replica::walk_org`]) and
    /// returns its commit counter; `None`, installing nothing, when the walk found no state
    /// (the org was never written).
    ///
    /// # Errors
    /// As
    /// [`Replica::restore_section`] and [`Replica::restore_entry`]. Nothing is installed on
    /// any error.
    pub async fn restore_walk(
        &self,
        org: &OrgId,
        walk: &OrgWalk,
        dest: &Path,
    ) -> Result<Option<u64>, Error> {
        let (installed, _) = self
            .install_walk(org, walk, dest, Durability::Synced)
            .await?;
        Ok(installed.snapshot.is_some().then_some(installed.commit))
    }

    /// [`Replica::restore_walk`] for a writer's own file that lives only as long as this
    /// process ([`Durability::Volatile`], a journal tenure's): nothing is fsynced and page 1
    /// says WAL mode, so installing and opening it cost no flush of the disk. Returns the
    /// commit counter installed (`None`: nothing, the org was never written) and what the
    /// install computed on the way ([`InstalledImage`]), so the tenure's first checkpoint
    /// needs no second read of the section nor of the file. The image is not
    /// `quick_check`ed here: the writer's connection does it ([`crate::sqlite::open_installed`]).
    ///
    /// # Errors
    /// As [`Replica::restore_walk`].
    pub(crate) async fn restore_walk_volatile(
        &self,
        org: &OrgId,
        walk: &OrgWalk,
        dest: &Path,
    ) -> Result<(Option<u64>, InstalledImage), Error> {
        let (installed, body) = self
            .install_walk(org, walk, dest, Durability::Volatile)
            .await?;
        Ok((
            installed.snapshot.is_some().then_some(installed.commit),
            body,
        ))
    }

    /// Installs at `dest` the state of the snapshot or delta entry at `seq` of `org`'s log
    /// (format 5 included), rebuilt by following its `base` links; returns its commit counter.
    ///
    /// # Errors
    /// [`Error::NoSuchSnapshot`] when `seq` or a base it links to is not a snapshot or delta
    /// entry; [`Error::ChainBroken`] when a delta does not apply to the state below it;
    /// [`Error::Corrupt`] for a base link that does not go down; the store's errors.
    pub async fn restore_entry(&self, org: &OrgId, seq: u64, dest: &Path) -> Result<u64, Error> {
        self.install_linked(org, seq, None, dest, None, Durability::Synced)
            .await
            .map(|(h, _)| h.commit)
    }

    /// Installs at `dest` the state of `org` that `section` of the batch `listed` holds: its
    /// base (the snapshot or delta entry at `section.base.seq` of `org`'s log, rebuilt by
    /// its links) with the section's pages applied. Returns the commit counter installed.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the section is not `org`'s or fails its digest, or its pages
    /// do not apply; [`Error::ChainBroken`] when the base's checksum or the result's differs
    /// from what the section names; [`Error::NoSuchSnapshot`] when the base names no snapshot
    /// or delta entry; the store's and the chain's errors. Nothing is installed on any error.
    pub async fn restore_section(
        &self,
        org: &OrgId,
        listed: &Listed,
        section: &SectionIndex,
        dest: &Path,
    ) -> Result<u64, Error> {
        self.install_linked(
            org,
            section.base.seq,
            None,
            dest,
            Some((listed, section)),
            Durability::Synced,
        )
        .await
        .map(|(h, _)| h.commit)
    }

    /// The chain that rebuilds the entry at `seq`: its snapshot and the deltas its `base`
    /// links go through, from `log` when it holds them, else read one at a time.
    async fn linked_chain(
        &self,
        org: &OrgId,
        seq: u64,
        log: Option<&BTreeMap<u64, LogEntry>>,
    ) -> Result<Chain, Error> {
        let mut deltas = Vec::new();
        let mut at = seq;
        loop {
            let held = log.and_then(|l| l.get(&at)).cloned();
            let entry = match held {
                Some(e) => Some(e),
                None => self.inner.log.read_journal_entry(org, at).await?,
            };
            let Some(entry) = entry.filter(|e| e.stored().is_some()) else {
                return Err(Error::NoSuchSnapshot {
                    org: org.to_string(),
                    seq: at,
                });
            };
            match entry.delta().map(|d| d.base) {
                None => {
                    deltas.reverse();
                    return Ok(Chain {
                        snapshot: entry,
                        deltas,
                    });
                }
                Some(base) if base < at => {
                    deltas.push(entry);
                    at = base;
                }
                Some(base) => {
                    return Err(Error::corrupt(
                        &format!("orgs/{org}/log/{at:020}.json"),
                        format!("a delta at {at} based on {base}, not below it"),
                    ));
                }
            }
        }
    }

    /// Installs the newest state of a journal org (`at: None`: its walk's state, K0) or the
    /// state of the snapshot or delta entry at `at` of its log, as [`Replica::restore`]
    /// reports it; a walk with no state installs nothing.
    pub(crate) async fn restore_journal(
        &self,
        org: &OrgId,
        at: Option<u64>,
        dest: &Path,
    ) -> Result<Hydrated, Error> {
        let installed = match at {
            Some(seq) => {
                self.install_linked(org, seq, None, dest, None, Durability::Synced)
                    .await?
            }
            None => {
                let walk = self.walk_org(org).await?;
                self.install_walk(org, &walk, dest, Durability::Synced)
                    .await?
            }
        };
        Ok(installed.0)
    }

    /// Installs `walk`'s state; one with no state installs nothing. Returns what
    /// [`Replica::install_linked`] returns.
    async fn install_walk(
        &self,
        org: &OrgId,
        walk: &OrgWalk,
        dest: &Path,
        durability: Durability,
    ) -> Result<(Hydrated, InstalledImage), Error> {
        let log = Some(&walk.log);
        match &walk.state {
            WalkState::Empty => Ok((
                Hydrated {
                    snapshot: None,
                    commit: 0,
                    position: None,
                    deltas: 0,
                },
                InstalledImage::default(),
            )),
            WalkState::Entry { seq } => {
                self.install_linked(org, *seq, log, dest, None, durability)
                    .await
            }
            WalkState::Section { batch, section } => {
                let base = section.base.seq;
                let section = Some((&**batch, section));
                self.install_linked(org, base, log, dest, section, durability)
                    .await
            }
        }
    }

    /// Installs the entry at `base` (rebuilt by its links), with `section` applied when
    /// given, as `durability` says. `position` is the log position of the base; `commit`
    /// the state's. The section is read while the base is rebuilt (independent reads, one
    /// round trip fewer on the acquire's critical path), and its body, checked by its digest
    /// and applied, is returned beside.
    async fn install_linked(
        &self,
        org: &OrgId,
        base: u64,
        log: Option<&BTreeMap<u64, LogEntry>>,
        dest: &Path,
        section: Option<(&Listed, &SectionIndex)>,
        durability: Durability,
    ) -> Result<(Hydrated, InstalledImage), Error> {
        if let Some((listed, s)) = section
            && s.org != org.as_str()
        {
            return Err(Error::corrupt(
                &format!(
                    "journals/{}/{:020}.jnl#{org}",
                    listed.header.run, listed.header.slot
                ),
                format!("a section of {} read as {org}'s", s.org),
            ));
        }
        let section_read = async {
            let Some((listed, s)) = section else {
                return Ok(None);
            };
            let object = format!(
                "journals/{}/{:020}.jnl#{org}",
                listed.header.run, listed.header.slot
            );
            let body = self.read_journal_section(listed, s).await?;
            Ok(Some((object, s.clone(), body)))
        };
        let tmp = temp_beside(dest, &new_nonce()?)?;
        let chain_read = async {
            let chain = self.linked_chain(org, base, log).await?;
            let file = FileImage::create(&tmp)?;
            let rebuilt = self.rebuild(org, &chain, file).await;
            Ok::<_, Error>((chain, rebuilt))
        };
        let (section, chain) = match tokio::join!(section_read, chain_read) {
            (Ok(section), Ok(chain)) => (section, chain),
            (Err(e), chain) => {
                // The image (if rebuilt) closes before its temp file goes.
                drop(chain);
                let t = tmp.clone();
                blocking("removing a temp file", move || {
                    discard(&t);
                    Ok(())
                })
                .await?;
                return Err(e);
            }
            (Ok(_), Err(e)) => return Err(e),
        };
        let (chain, rebuilt) = chain;
        let shipped = self.shipped(org, &chain.snapshot);
        let deltas = chain.deltas.len();
        let commit = chain
            .deltas
            .last()
            .unwrap_or(&chain.snapshot)
            .commit()
            .unwrap_or(0);
        let (org_id, dest_buf, t) = (org.clone(), dest.to_path_buf(), tmp.clone());
        // A restore's file is for anyone; a tenure's volatile file is checked by its writer.
        let check = match durability {
            Durability::Synced => Check::Now,
            Durability::Volatile => Check::ByWriter,
        };
        let applied = match rebuilt {
            Ok(mut r) => {
                blocking("applying a journal section", move || {
                    let Some((object, section, body)) = section else {
                        r.image.finish(durability)?;
                        let object = format!("orgs/{org_id}/log/{base:020}.json");
                        install_file(&object, &t, &dest_buf, durability, check)?;
                        let image = InstalledImage {
                            section_body: None,
                            hashes: Some(r.hashes),
                        };
                        return Ok((commit, image));
                    };
                    let before = checksum_hex(r.hashes.sum());
                    if before != section.base.checksum {
                        return Err(chain::broken(
                            &org_id,
                            base,
                            format!(
                                "the base's checksum is {before}, the section expects {}",
                                section.base.checksum
                            ),
                        ));
                    }
                    DeltaBody::parse(&object, &body)?.apply(&mut r.image, &mut r.hashes)?;
                    let after = checksum_hex(r.hashes.sum());
                    if after != section.checksum {
                        return Err(chain::broken(
                            &org_id,
                            base,
                            format!(
                                "the section leads to checksum {after}, it names {}",
                                section.checksum
                            ),
                        ));
                    }
                    r.image.finish(durability)?;
                    install_file(&object, &t, &dest_buf, durability, check)?;
                    let image = InstalledImage {
                        section_body: Some(body),
                        hashes: Some(r.hashes),
                    };
                    Ok((section.commit, image))
                })
                .await
            }
            Err(e) => Err(e),
        };
        if applied.is_err() {
            blocking("removing a temp file", move || {
                discard(&tmp);
                Ok(())
            })
            .await?;
        }
        applied.map(|(commit, body_out)| {
            let hydrated = Hydrated {
                snapshot: shipped,
                commit,
                position: Some(base),
                deltas,
            };
            (hydrated, body_out)
        })
    }
}

/// What an install of a journal state computed beside the [`Hydrated`] it reports.
#[derive(Debug, Default)]
pub(crate) struct InstalledImage {
    /// The section's delta body, checked by its digest and applied, when the state is a
    /// section.
    pub(crate) section_body: Option<Vec<u8>>,
    /// The installed image's page hashes, page 1 canonical (as the chain and the section
    /// name them); `None` when nothing was installed.
    pub(crate) hashes: Option<PageHashes>,
}
