//! Retention's side of clones (`docs/design.md` 2e): an origin keeps every segment a clone
//! reference in its `refs/` names; a clone deletes its reference in an origin once no
//! snapshot it keeps names a segment of that origin.

use std::collections::{BTreeSet, HashSet};

use tracing::warn;

use crate::format::clone_ref::CloneRef;
use crate::format::manifest::MAX_MANIFEST_BYTES;
use crate::{Error, LogEntry, OrgId, Replica};

impl Replica {
    /// Every segment of `org` that a clone reference names (one LIST, a GET per
    /// reference); `None` when one does not read back, so no segment may be judged.
    /// Called after the run's entry deletions: a clone whose reference landed after this
    /// LIST found its snapshot's entry gone and published nothing (2e).
    ///
    /// # Errors
    /// [`Error::Store`].
    pub(crate) async fn cloned_segments(
        &self,
        org: &OrgId,
    ) -> Result<Option<HashSet<String>>, Error> {
        let dir = self.inner.store.layout.refs_dir(org);
        let mut names = HashSet::new();
        for meta in self.inner.store.list_all(&dir).await? {
            let object = meta.location.to_string();
            let bytes = match self.get_capped(&meta.location, MAX_MANIFEST_BYTES).await {
                Ok(b) => b,
                // Its clone let go of it since the LIST.
                Err(Error::MissingObject { .. }) => continue,
                Err(Error::Corrupt { .. }) => return Ok(None),
                Err(e) => return Err(e),
            };
            match CloneRef::decode(&object, org.as_str(), &bytes) {
                Ok(r) => names.extend(r.segments),
                Err(e) => {
                    warn!(%org, object, error = %e, "an unreadable clone reference keeps every segment");
                    return Ok(None);
                }
            }
        }
        Ok(Some(names))
    }

    /// Deletes the clone reference of `org` in each origin that a snapshot in `doomed`
    /// (deleted by this run, before this is called) named and no snapshot in `kept` does.
    /// A later snapshot of `org` names only segments of the newest one (kept) or its own,
    /// so none names that origin again. A manifest that cannot be read keeps every
    /// reference (they only keep segments longer).
    ///
    /// # Errors
    /// [`Error::Store`].
    pub(crate) async fn release_clone_refs(
        &self,
        org: &OrgId,
        doomed: &[&LogEntry],
        kept: &[&LogEntry],
    ) -> Result<(), Error> {
        let origins = |names: &[String]| -> BTreeSet<String> {
            names
                .iter()
                .filter_map(|n| n.split_once('/').map(|(o, _)| o.to_owned()))
                .collect()
        };
        let mut gone = BTreeSet::new();
        for e in doomed.iter().filter(|e| e.is_snapshot()) {
            let (Some(name), Some(stored)) = (e.manifest(), e.stored()) else {
                continue;
            };
            match self.segment_names(org, name, stored.bytes).await {
                Ok(names) => gone.extend(origins(&names)),
                Err(Error::MissingObject { .. } | Error::Corrupt { .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        if gone.is_empty() {
            return Ok(());
        }
        for e in kept.iter().filter(|e| e.is_snapshot()) {
            let (Some(name), Some(stored)) = (e.manifest(), e.stored()) else {
                continue;
            };
            match self.segment_names(org, name, stored.bytes).await {
                Ok(names) => {
                    for o in origins(&names) {
                        gone.remove(&o);
                    }
                }
                Err(Error::MissingObject { .. } | Error::Corrupt { .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
            if gone.is_empty() {
                return Ok(());
            }
        }
        for origin in gone {
            let Ok(origin) = OrgId::new(&origin) else {
                continue;
            };
            self.delete(&self.inner.store.layout.clone_ref(&origin, org))
                .await?;
        }
        Ok(())
    }
}
