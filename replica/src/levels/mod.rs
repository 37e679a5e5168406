//! The point-in-time window's levels (`docs/design.md` 2d): a closed chain's positions kept
//! at a coarser grain in one level file, so a restore of any moment in the window reads a
//! snapshot, one level file and at most a bucket of deltas.
//!
//! The only writer of `orgs/<org>/levels/` is [`Replica::compact_levels`]; retention deletes
//! level files with their snapshot; readers are restore, `position_at_time` and verify.

mod compact;
mod restore;

pub use compact::LevelReport;

use futures::TryStreamExt;

use crate::format::level::{LevelFile, parse_level_name};
use crate::{Error, OrgId, Replica};

/// A closed chain needs at least this many deltas for a level file: with fewer, a restore
/// reads the deltas themselves (no more objects than a level file saves), and the chain's
/// one PUT would cost more than the objects it lets retention delete.
pub const LEVEL_MIN_DELTAS: usize = 4;

/// Largest uncompressed sections of one level file, bytes (64 MiB): a chain whose changes
/// are larger keeps its deltas for the window instead, so a compaction's memory is bounded
/// by this setting, not by the database (I14).
pub const MAX_LEVEL_BYTES: u64 = 64 << 20;

/// A level file named in `orgs/<org>/levels/`: the chain it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LevelName {
    pub(crate) snapshot: u64,
    pub(crate) end: u64,
    pub(crate) name: String,
}

impl Replica {
    /// The level files of `org`, by their names (one LIST). Objects with other names are
    /// left out (nothing else is written there).
    ///
    /// # Errors
    /// [`Error::Store`].
    pub(crate) async fn level_names(&self, org: &OrgId) -> Result<Vec<LevelName>, Error> {
        let dir = self.inner.store.layout.levels_dir(org);
        let listed: Vec<_> = self
            .inner
            .store
            .object
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| Error::store("list", &dir, e))?;
        let mut out: Vec<LevelName> = listed
            .iter()
            .filter_map(|m| {
                let name = m.location.filename()?;
                let (snapshot, end) = parse_level_name(name)?;
                Some(LevelName {
                    snapshot,
                    end,
                    name: name.to_owned(),
                })
            })
            .collect();
        out.sort_by_key(|l| (l.snapshot, l.end));
        Ok(out)
    }

    /// Reads and checks the level file `level` of `org` (its header against its name and
    /// org; sections are checked when read).
    ///
    /// # Errors
    /// [`Error::MissingObject`] when it is gone; [`Error::Corrupt`]; [`Error::Store`].
    pub(crate) async fn read_level(
        &self,
        org: &OrgId,
        level: &LevelName,
    ) -> Result<LevelFile, Error> {
        let path = self.inner.store.layout.level(org, &level.name);
        let object = path.to_string();
        let bytes = self
            .get_bytes(&path)
            .await?
            .ok_or_else(|| Error::MissingObject {
                path: object.clone(),
            })?;
        LevelFile::parse(&object, bytes, org.as_str(), level.snapshot, level.end)
    }
}
