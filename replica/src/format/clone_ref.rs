//! A clone reference: `orgs/<org>/refs/<clone>.json`, written by a clone into the org whose
//! segments its manifest names, so that org's retention keeps them (`docs/design.md` 2e):
//!
//! ```text
//! {"v":1,"org":"acme","clone":"acme-preview","snapshot":7,
//!  "segments":["00000000000000000007-3-<sha256>.seg.zst", …]}
//! ```
//!
//! It lives in the origin's folder, beside what it protects, so one LIST of that folder
//! tells retention every segment another org still names. The clone's retention deletes it
//! once no snapshot the clone keeps names a segment of that origin.

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::format::manifest::segment_sha;

/// Version of the clone reference format.
pub(crate) const CLONE_REF_VERSION: u64 = 1;

/// The segments of `org` that the org `clone` names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CloneRef {
    pub(crate) v: u64,
    /// The org whose segments these are.
    pub(crate) org: String,
    /// The org whose manifests name them.
    pub(crate) clone: String,
    /// The snapshot of `org` the clone was made from (for operators; not a reference).
    pub(crate) snapshot: u64,
    /// Segment object names in `org`'s `snap/` folder.
    pub(crate) segments: Vec<String>,
}

impl CloneRef {
    /// Serializes the reference.
    ///
    /// # Errors
    /// [`Error::Encode`] if serde fails (it does not for this type).
    pub(crate) fn encode(&self) -> Result<Vec<u8>, Error> {
        serde_json::to_vec(self).map_err(|source| Error::Encode {
            what: "clone reference",
            source,
        })
    }

    /// Parses the reference read from `object` in `org`'s folder.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when it does not parse, names another org, or holds a name that
    /// is not a segment's; [`Error::UnknownFormat`] for another version.
    pub(crate) fn decode(object: &str, org: &str, bytes: &[u8]) -> Result<CloneRef, Error> {
        let r: CloneRef = serde_json::from_slice(bytes).map_err(|e| Error::corrupt(object, e))?;
        if r.v != CLONE_REF_VERSION {
            return Err(Error::UnknownFormat {
                object: object.into(),
                detail: format!("clone reference version {}", r.v),
            });
        }
        if r.org != org {
            return Err(Error::corrupt(object, format!("names org {:?}", r.org)));
        }
        if let Some(bad) = r.segments.iter().find(|s| segment_sha(s).is_none()) {
            return Err(Error::corrupt(object, format!("bad segment name {bad:?}")));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::manifest::segment_name;

    #[test]
    fn a_reference_reads_back_only_in_its_own_org_and_with_segment_names() -> Result<(), Error> {
        let r = CloneRef {
            v: CLONE_REF_VERSION,
            org: "acme".into(),
            clone: "preview".into(),
            snapshot: 7,
            segments: vec![segment_name(7, 3, &"cd".repeat(32))],
        };
        let bytes = r.encode()?;
        assert_eq!(CloneRef::decode("r", "acme", &bytes)?, r);
        assert!(matches!(
            CloneRef::decode("r", "other", &bytes),
            Err(Error::Corrupt { .. })
        ));
        let bad = CloneRef {
            segments: vec!["../../x".into()],
            ..r.clone()
        };
        assert!(matches!(
            CloneRef::decode("r", "acme", &bad.encode()?),
            Err(Error::Corrupt { .. })
        ));
        let future = CloneRef { v: 2, ..r };
        assert!(matches!(
            CloneRef::decode("r", "acme", &future.encode()?),
            Err(Error::UnknownFormat { .. })
        ));
        Ok(())
    }
}
