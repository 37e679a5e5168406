//! The point-in-time window's levels (`docs/design.md` 2d): a closed chain's positions kept
//! at a coarser grain in one level file, so a restore of any moment in the window reads a
//! snapshot, one level file and at most a bucket of deltas.
//!
//! The only writer of `orgs/<org>/levels/` is [`Replica::compact_levels`]; retention deletes
//! level files with their snapshot; readers are restore, `position_at_time` and verify.

mod compact;
pub(crate) mod restore;
pub(crate) mod sparse;
mod verify;

pub use compact::LevelReport;

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

/// A position a level file keeps: the last position of one bucket of a closed chain, which
/// [`Replica::restore`] rebuilds even after retention deleted the chain's deltas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LevelPosition {
    /// The log position it stands for.
    pub seq: u64,
    /// The round that published it.
    pub round: u64,
    /// When it was published, ms since the Unix epoch (its writer's clock).
    pub at_ms: u64,
    /// The commit counter there.
    pub commit: u64,
    /// The seq of its chain's snapshot.
    pub snapshot: u64,
    /// Stored bytes of its section (compressed).
    pub compressed_bytes: u64,
    /// Uncompressed bytes of its section (whole pages and their headers).
    pub bytes: u64,
    /// The chain's deltas it stands for.
    pub positions: u64,
}

/// A level file named in `orgs/<org>/levels/`: the chain it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LevelName {
    pub(crate) snapshot: u64,
    pub(crate) end: u64,
    pub(crate) name: String,
}

impl Replica {
    /// Every position the level files of `org` keep, ascending by seq (`docs/design.md`
    /// 2d): one LIST and a GET per level file. Positions the log still holds as deltas are
    /// listed too (a section stands for the same state).
    ///
    /// # Errors
    /// [`Error::Store`]; [`Error::Corrupt`]/[`Error::UnknownFormat`] for a level file that
    /// does not read back.
    pub async fn level_positions(&self, org: &OrgId) -> Result<Vec<LevelPosition>, Error> {
        let mut out = Vec::new();
        for level in self.level_names(org).await? {
            let file = match self.read_level(org, &level).await {
                Ok(f) => f,
                // Deleted by retention since the LIST.
                Err(Error::MissingObject { .. }) => continue,
                Err(e) => return Err(e),
            };
            out.extend(file.header.sections.iter().map(|s| LevelPosition {
                seq: s.seq,
                round: s.round,
                at_ms: s.at_ms,
                commit: s.commit,
                snapshot: level.snapshot,
                compressed_bytes: s.len,
                bytes: s.bytes,
                positions: s.positions,
            }));
        }
        out.sort_by_key(|p| p.seq);
        Ok(out)
    }

    /// The level files of `org`, by their names (one LIST). Objects with other names are
    /// left out (nothing else is written there).
    ///
    /// # Errors
    /// [`Error::Store`].
    pub(crate) async fn level_names(&self, org: &OrgId) -> Result<Vec<LevelName>, Error> {
        let dir = self.inner.store.layout.levels_dir(org);
        let listed = self.inner.store.list_all(&dir).await?;
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
        // Never more than a compactor writes (sections of at most MAX_LEVEL_BYTES, which zstd
        // never expands by more than a small fraction, and the header).
        let bytes = self
            .get_capped(&path, 2 * MAX_LEVEL_BYTES + (8 << 20))
            .await?;
        LevelFile::parse(&object, bytes, org.as_str(), level.snapshot, level.end)
    }
}
