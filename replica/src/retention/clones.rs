//! Retention's side of clones (`docs/design.md` 2e): an origin keeps every segment a clone
//! reference in its `refs/` names; a clone deletes its reference in an origin once no
//! snapshot it keeps names a segment of that origin.

use std::collections::{BTreeSet, HashSet};

use tracing::warn;

use crate::format::clone_ref::CloneRef;
use crate::format::manifest::{MAX_MANIFEST_BYTES, Manifest};
use crate::{Error, LogEntry, OrgId, Replica};

/// A clone that names segments of an org: what its reference in the org's `refs/` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneReference {
    /// The org whose manifests name the segments.
    pub clone: OrgId,
    /// The snapshot of the origin it was cloned from (its seq).
    pub snapshot: u64,
    /// How many of the origin's segments it names.
    pub segments: usize,
}

impl Replica {
    /// The clones that name segments of `org` (`docs/design.md` 2e): one LIST of its
    /// `refs/` and a GET per reference. An operator reads it before deleting `org`'s
    /// objects, which would break these clones.
    ///
    /// # Errors
    /// [`Error::Corrupt`]/[`Error::UnknownFormat`] for a reference that does not read back;
    /// [`Error::Store`].
    pub async fn clones_of(&self, org: &OrgId) -> Result<Vec<CloneReference>, Error> {
        let dir = self.inner.store.layout.refs_dir(org);
        let mut out = Vec::new();
        for meta in self.inner.store.list_all(&dir).await? {
            let object = meta.location.to_string();
            let bytes = match self.get_capped(&meta.location, MAX_MANIFEST_BYTES).await {
                Ok(b) => b,
                Err(Error::MissingObject { .. }) => continue,
                Err(e) => return Err(e),
            };
            let r = CloneRef::decode(&object, org.as_str(), &bytes)?;
            let clone = OrgId::new(&r.clone).map_err(|e| Error::corrupt(&object, e.to_string()))?;
            out.push(CloneReference {
                clone,
                snapshot: r.snapshot,
                segments: r.segments.len(),
            });
        }
        out.sort_by(|a, b| a.clone.cmp(&b.clone));
        Ok(out)
    }

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

    /// Deletes the clone reference of `org` in each origin that a manifest in `orphans`
    /// (manifests of `org` no kept entry names, whose snapshots are deleted or never
    /// landed) named and no snapshot in `kept` does. A later snapshot of `org` names only
    /// segments of the newest one (kept) or its own, so none names that origin again. A
    /// kept manifest that cannot be read keeps every reference (they only keep segments
    /// longer); an orphan that cannot be read releases nothing of its own.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub(crate) async fn release_clone_refs(
        &self,
        org: &OrgId,
        orphans: &[&str],
        kept: &[&LogEntry],
    ) -> Result<(), Error> {
        let origins = |names: &[String]| -> BTreeSet<String> {
            names
                .iter()
                .filter_map(|n| n.split_once('/').map(|(o, _)| o.to_owned()))
                .collect()
        };
        let mut gone = BTreeSet::new();
        for name in orphans {
            match self.orphan_segment_names(org, name).await {
                Ok(names) => gone.extend(origins(&names)),
                Err(
                    Error::MissingObject { .. }
                    | Error::Corrupt { .. }
                    | Error::UnknownFormat { .. },
                ) => {}
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

    /// The segment names of the manifest `name` of `org` that no kept entry names (so its
    /// image size is not known from an entry): checked against the sha256 its name holds
    /// and decoded as any manifest, for the size it describes. Read once per handle.
    async fn orphan_segment_names(
        &self,
        org: &OrgId,
        name: &str,
    ) -> Result<std::sync::Arc<Vec<String>>, Error> {
        let path = self.inner.store.layout.blob(org, name);
        let key = path.to_string();
        if let Some(names) = self.inner.segment_refs.get(&key) {
            return Ok(names);
        }
        let bytes = self.get_capped(&path, MAX_MANIFEST_BYTES).await?;
        let shape: Shape = serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(&key, e))?;
        let image = u64::from(shape.pages) * u64::from(shape.page_size);
        let manifest = Manifest::decode(&key, name, &bytes, image)?;
        let names: std::sync::Arc<Vec<String>> =
            std::sync::Arc::new(manifest.segments.into_iter().map(|s| s.0).collect());
        self.inner.segment_refs.insert(&key, names.clone());
        Ok(names)
    }
}

/// The size fields of a manifest, read before it is decoded against them.
#[derive(serde::Deserialize)]
struct Shape {
    page_size: u32,
    pages: u32,
}
