//! SQLite's own checks of a database (I10): `quick_check` before an install, a full
//! `integrity_check` of every snapshot and rebuilt chain by verify.

use rusqlite::Connection;

use crate::Error;

/// Runs `PRAGMA <check>` (`quick_check` or `integrity_check`) on an open database; anything
/// but a single `ok` row is corruption of `what`.
///
/// # Errors
/// [`Error::Corrupt`] naming `what`, with SQLite's findings.
pub(crate) fn sqlite_check(conn: &Connection, check: &str, what: &str) -> Result<(), Error> {
    let mut stmt = conn
        .prepare(&format!("PRAGMA {check}"))
        .map_err(|e| Error::corrupt(what, format!("{check}: {e}")))?;
    let rows: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .and_then(|it| it.collect())
        .map_err(|e| Error::corrupt(what, format!("{check}: {e}")))?;
    if rows.len() == 1 && rows[0] == "ok" {
        Ok(())
    } else {
        Err(Error::corrupt(
            what,
            format!("{check}: {}", rows.join("; ")),
        ))
    }
}

/// Full `integrity_check` of the database file at `path`, opened read-only.
///
/// # Errors
/// [`Error::Corrupt`] naming `what`.
pub(crate) fn integrity_check_file(what: &str, path: &std::path::Path) -> Result<(), Error> {
    let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| Error::corrupt(what, format!("open: {e}")))?;
    sqlite_check(&conn, "integrity_check", what)
}
