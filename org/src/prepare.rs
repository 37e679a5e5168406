//! Making an existing SQLite database an org's database: what `idem import` runs on a copy of
//! a tenant's file before shipping it as the org's first snapshot.

use rusqlite::Connection;

use crate::commit;

/// Creates what an org's writer creates in its database when it opens it: the commit
/// sequence table and idem's schema. Idempotent.
pub(crate) fn create(conn: &Connection) -> Result<(), idem::Error> {
    conn.execute_batch(commit::SCHEMA)?;
    idem::ensure_schema(conn)
}

/// Prepares `conn`'s database to become an org's first snapshot: creates the tables an org's
/// writer creates on open (existing tables and rows are kept), forgets the highest round of
/// an earlier history if the file was an idem database already (the new org's rounds start
/// at 1: [`idem::restart_rounds`]), and returns the commit sequence the file now holds. The
/// snapshot must be published with exactly this commit, or the org
/// refuses it on acquire ([`crate::Error::CommitMismatch`]).
///
/// # Errors
/// [`idem::Error::SchemaTooNew`] for a database written by a newer idem; [`idem::Error::Sqlite`]
/// on any SQLite failure (a read-only or corrupt file included).
///
/// # Examples
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_org::rusqlite::Connection;
///
/// let conn = Connection::open_in_memory()?;
/// conn.execute_batch("CREATE TABLE accounts (id INTEGER PRIMARY KEY, cents INT)")?;
/// assert_eq!(idem_org::prepare_database(&conn)?, 0);
/// # Ok(())
/// # }
/// ```
pub fn prepare_database(conn: &Connection) -> Result<u64, idem::Error> {
    create(conn)?;
    idem::restart_rounds(conn)?;
    Ok(commit::read(conn)?)
}
