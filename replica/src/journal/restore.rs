//! A journal section installed as a database (`docs/design.md` 3g, "Readers"): the state a
//! walk found is the newest section read applied to the base it names, nothing else. The
//! base is rebuilt from the org's log by the seq the section names (its chain, checked as
//! every hydrate checks it), its checksum must be the one the section names, then the
//! section's pages are applied and the result must have the section's checksum (I10). The
//! file is built beside `dest` and renamed over it only when every check passed.

use std::path::Path;

use crate::chain::{self, Chain};
use crate::format::body::DeltaBody;
use crate::format::checksum::checksum_hex;
use crate::format::layout::new_nonce;
use crate::journal::SectionIndex;
use crate::journal::io::Listed;
use crate::rebuild::image::FileImage;
use crate::rebuild::install::{discard, install_file, temp_beside};
use crate::replica::blocking;
use crate::{Error, OrgId, Replica};

impl Replica {
    /// Installs at `dest` the state of `org` that `section` of the batch `listed` holds: its
    /// base (the snapshot or delta entry at `section.base.seq` of `org`'s log, rebuilt from
    /// its chain) with the section's pages applied. Returns the commit counter installed.
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
        if section.org != org.as_str() {
            return Err(Error::corrupt(
                &format!(
                    "journals/{}/{:020}.jnl",
                    listed.header.run, listed.header.slot
                ),
                format!("a section of {} read as {org}'s", section.org),
            ));
        }
        let body = self.read_journal_section(listed, section).await?;
        let base = section.base.seq;
        let log = self.tail(org, base.saturating_add(1)).await?;
        let chain = chain::newest(org, &log, base.saturating_add(1))?;
        if chain.as_ref().map(Chain::position) != Some(base) {
            return Err(Error::NoSuchSnapshot {
                org: org.to_string(),
                seq: base,
            });
        }
        let Some(chain) = chain else {
            return Err(Error::NoSuchSnapshot {
                org: org.to_string(),
                seq: base,
            });
        };
        let tmp = temp_beside(dest, &new_nonce()?)?;
        let file = FileImage::create(&tmp)?;
        let rebuilt = self.rebuild(org, &chain, file).await;
        let object = format!(
            "journals/{}/{:020}.jnl#{org}",
            listed.header.run, listed.header.slot
        );
        let (org_id, section, dest_buf, t) = (
            org.clone(),
            section.clone(),
            dest.to_path_buf(),
            tmp.clone(),
        );
        let applied = match rebuilt {
            Ok(mut r) => {
                blocking("applying a journal section", move || {
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
                    r.image.sync()?;
                    install_file(&object, &t, &dest_buf)?;
                    Ok(section.commit)
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
        applied
    }
}
