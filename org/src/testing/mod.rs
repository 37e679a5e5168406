//! Support that only tests use, behind the `test-util` feature: enable it from
//! `[dev-dependencies]`, never in a production build.

use std::path::Path;

use crate::{Error, Org};

/// Count of claim lock files under a data directory, not counting released claims' files
/// kept for reuse: for tests of bounded open files and of what a release keeps.
pub fn open_claims(data_dir: &Path) -> usize {
    let Ok(orgs) = std::fs::read_dir(data_dir.join("orgs")) else {
        return 0;
    };
    orgs.flatten()
        .filter_map(|o| std::fs::read_dir(o.path()).ok())
        .flat_map(|d| d.flatten())
        .filter(|e| e.path().extension().is_some_and(|x| x == "lock"))
        .filter(|e| !e.path().with_extension("cache").exists())
        .count()
}

impl Org {
    /// The database image as the writer connection sees it (`sqlite3_serialize`), once it
    /// is shipped and confirmed like [`Org::read`]: for tests that compare it with a restore.
    ///
    /// # Errors
    /// As [`Org::read`].
    pub async fn image(&self) -> Result<Vec<u8>, Error> {
        self.read_mut(|conn| Ok(conn.serialize(rusqlite::MAIN_DB)?.to_vec()))
            .await
    }
}
