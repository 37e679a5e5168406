//! Object naming. Every path is built here from a validated [`OrgId`] (I12):
//!
//! ```text
//! <prefix>/orgs/<org>/log/<seq:020>.json                    create-only history
//! <prefix>/orgs/<org>/snap/<seq:020>-<round>-<sha256>.seg.zst  snapshot segments (by content)
//! <prefix>/orgs/<org>/snap/<seq:020>-<round>-<sha256>.manifest.json  snapshot manifests
//! <prefix>/orgs/<org>/snap/<seq:020>-<round>-<nonce>.delta.zst  immutable delta blobs
//! <prefix>/orgs/<org>/snap/<seq:020>-<round>-<nonce>.db.zst  whole snapshots (earlier builds)
//! <prefix>/orgs/<org>/levels/<snap:020>-<end:020>.lvl        a closed chain's level file
//! <prefix>/orgs/<org>/refs/<clone>.json                     segments a clone names (2e)
//! <prefix>/orgs/<org>/lease.json                            advisory lease of the org's claim
//! <prefix>/processes/<instance>.json                        a writer process's lease
//! <prefix>/journals/<instance>-<run:020>/<slot:020>.jnl     a writer's journal (3g)
//! ```

use object_store::path::Path;

use crate::OrgId;

#[derive(Debug, Clone)]
pub(crate) struct Layout {
    root: String,
}

impl Layout {
    pub(crate) fn new(prefix: &str) -> Self {
        let root = prefix
            .split('/')
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("/");
        Layout { root }
    }
    fn join(&self, rest: &str) -> Path {
        if self.root.is_empty() {
            Path::from(rest)
        } else {
            Path::from(format!("{}/{rest}", self.root))
        }
    }
    pub(crate) fn orgs(&self) -> Path {
        self.join("orgs")
    }
    pub(crate) fn probe(&self, nonce: &str) -> Path {
        self.join(&format!("probe/{nonce}"))
    }
    pub(crate) fn log_dir(&self, org: &OrgId) -> Path {
        self.join(&format!("orgs/{org}/log"))
    }
    pub(crate) fn snap_dir(&self, org: &OrgId) -> Path {
        self.join(&format!("orgs/{org}/snap"))
    }
    pub(crate) fn levels_dir(&self, org: &OrgId) -> Path {
        self.join(&format!("orgs/{org}/levels"))
    }
    /// `name` must pass [`crate::format::level::parse_level_name`] (one path segment, I12).
    pub(crate) fn level(&self, org: &OrgId, name: &str) -> Path {
        self.join(&format!("orgs/{org}/levels/{name}"))
    }
    /// The objects of one journal run (`run` validated when parsed or built, I12).
    pub(crate) fn journal_dir(&self, run: &crate::format::journal::RunName) -> Path {
        self.join(&format!("journals/{run}"))
    }
    pub(crate) fn journal(&self, run: &crate::format::journal::RunName, slot: u64) -> Path {
        self.join(&format!("journals/{run}/{slot:020}.jnl"))
    }
    pub(crate) fn log(&self, org: &OrgId, seq: u64) -> Path {
        self.join(&format!("orgs/{org}/log/{seq:020}.json"))
    }
    pub(crate) fn blob(&self, org: &OrgId, name: &str) -> Path {
        self.join(&format!("orgs/{org}/snap/{name}"))
    }
    /// Where a segment of a manifest of `org` lives: in `org`'s `snap/`, or in its origin's
    /// when another org uploaded it (a clone). The origin was checked as an org id when the
    /// manifest was decoded; a name that is none is [`crate::Error::Corrupt`].
    pub(crate) fn segment(
        &self,
        org: &OrgId,
        seg: &crate::format::manifest::SegmentRef,
    ) -> Result<Path, crate::Error> {
        match seg.origin() {
            None => Ok(self.blob(org, seg.name())),
            Some(origin) => {
                let origin = OrgId::new(origin)
                    .map_err(|e| crate::Error::corrupt(seg.name(), e.to_string()))?;
                Ok(self.blob(&origin, seg.file()))
            }
        }
    }
    /// The folder of the clone references of `org` (2e).
    pub(crate) fn refs_dir(&self, org: &OrgId) -> Path {
        self.join(&format!("orgs/{org}/refs"))
    }
    /// The reference by which the clone `clone` keeps segments of `org` (2e).
    pub(crate) fn clone_ref(&self, org: &OrgId, clone: &OrgId) -> Path {
        self.join(&format!("orgs/{org}/refs/{clone}.json"))
    }
    pub(crate) fn lease(&self, org: &OrgId) -> Path {
        self.join(&format!("orgs/{org}/lease.json"))
    }
    /// The folder of every process lease.
    pub(crate) fn processes(&self) -> Path {
        self.join("processes")
    }
    /// `instance` must pass `lease::valid_instance` (one path segment, I12).
    pub(crate) fn process(&self, instance: &str) -> Path {
        self.join(&format!("processes/{instance}.json"))
    }
}

/// `<seq:020>.json` → seq.
pub(crate) fn parse_log_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".json")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `<seq:020>-...` → seq.
pub(crate) fn parse_blob_seq(name: &str) -> Option<u64> {
    let digits = name.get(..20)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub(crate) fn delta_blob_name(seq: u64, round: u64, nonce: &str) -> String {
    format!("{seq:020}-{round}-{nonce}.delta.zst")
}

/// 16 random bytes, hex: a log entry's nonce, a blob name's suffix, an instance id.
///
/// # Errors
/// [`crate::Error::Random`] when the system's random number generator fails.
pub(crate) fn new_nonce() -> Result<String, crate::Error> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|source| crate::Error::Random { source })?;
    Ok(hex::encode(b))
}
