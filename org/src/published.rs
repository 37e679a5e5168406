//! Reads that never claim: [`Registry::read`] answers from this process's writer when it
//! holds the org, else from the store's newest published state, and creates nothing in the
//! store either way (no claim, no lease), so reading an org another replica holds never
//! fences it, and reading a tenant never written leaves no trace.

use std::path::{Path, PathBuf};

use idem_replica::OrgId;
use rusqlite::{Connection, OpenFlags};

use crate::{Error, Registry};

/// The folder of the data directory that [`Registry::read`] restores published states into,
/// one private temp folder per read, removed when the read ends (and the whole folder when a
/// registry that holds the data directory's lock is built: a killed process leaves them).
pub(crate) const READS_DIR: &str = "reads";

/// Where a [`Registry::read`] read the org's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadSource {
    /// This process's writer, confirmed current like a replay ([`crate::Org::read`]): every
    /// acknowledged commit of the org, and none that the store does not hold (I6, I7).
    Writer {
        /// The writer's round.
        round: u64,
    },
    /// The store's newest published state, restored and verified: the snapshot and its
    /// deltas up to log position `seq`. It holds every commit acknowledged before the read
    /// listed the log; a writer elsewhere may have acknowledged more since.
    Store {
        /// Log position of the last entry applied (the snapshot's or the last delta's).
        seq: u64,
        /// The org's commit counter in that state.
        commit: u64,
    },
    /// Nothing published: the org was never written. The read ran on an empty in-memory
    /// database prepared as a first acquire prepares one (idem's tables, then the registry's
    /// `on_open` hook), and nothing was created in the store or on disk.
    Empty,
}

/// What a [`Registry::read`] returned, and where it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOutcome<T> {
    /// The read's result.
    pub value: T,
    /// Where it read.
    pub source: ReadSource,
}

impl Registry {
    /// Runs `read` on `org`'s state without claiming it: on this process's writer when it
    /// holds the org ([`crate::Org::read`]: in a transaction rolled back after, answered once
    /// confirmed), else on the store's newest published state restored into a private temp
    /// file under the data directory (`reads/`, deleted after) and opened read-only, else,
    /// for an org with nothing published, on an empty in-memory database prepared like a new
    /// org's ([`ReadSource::Empty`]). Never writes to the store: a tenant never written stays
    /// unwritten, and an org another replica holds is never fenced by a read. What `idem
    /// serve`'s `GET /orgs/{org}/balances` runs.
    ///
    /// `read` is `Clone` because a writer that closes or is fenced meanwhile (it no longer
    /// holds the org) is not retried: the read runs again on the store's state.
    ///
    /// # Errors
    /// [`Error::Read`] when `read` fails or panics; [`Error::Replica`] when the store cannot
    /// be read or a published state fails its checks (its kind says what to do);
    /// [`Error::DataDir`] when the temp file cannot be made; [`Error::Task`] when the
    /// blocking task is cancelled.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_org::replica::{OrgId, Replica, Settings};
    /// use idem_org::{ReadSource, Registry};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let url = dir.path().join("store/prod").display().to_string();
    /// let replica = Replica::open_url(&url, Settings::default()).await?;
    /// let registry = Registry::builder(dir.path().join("data"), replica, "replica-a")
    ///     .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS notes (text TEXT)"))
    ///     .build()?;
    /// let count = |c: &idem_org::rusqlite::Connection| {
    ///     c.query_row("SELECT count(*) FROM notes", [], |r| r.get::<_, i64>(0))
    /// };
    ///
    /// // A tenant never written: an empty database, and nothing created in the store.
    /// let acme = OrgId::new("acme")?;
    /// let read = registry.read(&acme, count).await?;
    /// assert_eq!((read.value, read.source), (0, ReadSource::Empty));
    /// assert!(registry.replica().orgs().await?.is_empty());
    ///
    /// registry
    ///     .once(&acme, "k-1", |tx| {
    ///         tx.execute("INSERT INTO notes VALUES ('hi')", [])?;
    ///         Ok::<_, idem_org::rusqlite::Error>(Vec::new())
    ///     })
    ///     .await?;
    /// // This process holds acme now: its writer answers.
    /// let read = registry.read(&acme, count).await?;
    /// assert_eq!(read.value, 1);
    /// assert!(matches!(read.source, ReadSource::Writer { .. }));
    /// registry.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read<T, F>(&self, org: &OrgId, read: F) -> Result<ReadOutcome<T>, Error>
    where
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Clone + Send + 'static,
        T: Send + 'static,
    {
        if let Some(handle) = self.serving(org) {
            match handle.read(read.clone()).await {
                Ok(value) => {
                    return Ok(ReadOutcome {
                        value,
                        source: ReadSource::Writer {
                            round: handle.round(),
                        },
                    });
                }
                Err(e @ Error::Read { .. }) => return Err(e),
                Err(e) => {
                    tracing::debug!(org = %org, error = %idem_base::ErrorChain::new(&e), "read from the store instead of the writer");
                }
            }
        }
        self.read_published(org, read).await
    }

    /// The store half of [`Registry::read`]: never the writer, never a claim.
    async fn read_published<T, F>(&self, org: &OrgId, read: F) -> Result<ReadOutcome<T>, Error>
    where
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let reads = self.data_dir().join(READS_DIR);
        let dir_err = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::DataDir { path, source }
        };
        std::fs::create_dir_all(&reads).map_err(dir_err(&reads))?;
        let tmp = tempfile::Builder::new()
            .prefix("read-")
            .tempdir_in(&reads)
            .map_err(dir_err(&reads))?;
        let path = tmp.path().join(format!("{org}.db"));
        let hydrated = self
            .replica()
            .restore(org, None, &path)
            .await
            .map_err(|e| Error::replica(org, e))?;
        let source = match (hydrated.snapshot.is_some(), hydrated.position) {
            (true, Some(seq)) => ReadSource::Store {
                seq,
                commit: hydrated.commit,
            },
            _ => ReadSource::Empty,
        };
        let init = self.init_fn();
        let owner = org.clone();
        let db: Option<PathBuf> = (source != ReadSource::Empty).then_some(path);
        let value = tokio::task::spawn_blocking(move || {
            // The temp folder lives until the read is done.
            let _tmp = tmp;
            let conn = match db {
                Some(path) => Connection::open_with_flags(
                    &path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .map_err(idem::BoxError::from),
                None => empty(init.as_ref()),
            };
            conn.and_then(|c| read(&c).map_err(idem::BoxError::from))
                .map_err(|source| Error::Read { org: owner, source })
        })
        .await
        .map_err(|source| Error::Task {
            org: org.clone(),
            op: "read",
            source,
        })??;
        Ok(ReadOutcome { value, source })
    }
}

/// An empty in-memory database prepared as a first acquire prepares a new org's: idem's
/// tables, then the registry's `on_open` hook.
fn empty(init: Option<&crate::InitFn>) -> Result<Connection, idem::BoxError> {
    let conn = Connection::open_in_memory()?;
    crate::prepare::create(&conn)?;
    if let Some(init) = init {
        init(&conn)?;
    }
    Ok(conn)
}
