//! [`stats`]: counts over the dedup table, so tools never read `idem_keys` themselves.

use rusqlite::{Connection, OptionalExtension};

use crate::Error;
use crate::error::optional_missing;

/// Counts over the idempotency keys of one database, as [`stats`] reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Keys whose effect is committed (each replays its stored result, I3).
    pub applied_keys: u64,
    /// Keys with failed attempts only: counted by `once` (I5) and not applied.
    pub failed_only_keys: u64,
    /// The earliest `applied_at` of an applied key, in ms since the Unix epoch; `None` when no
    /// key is applied.
    pub oldest_applied_at_ms: Option<u64>,
    /// The latest `applied_at` of an applied key, in ms since the Unix epoch; `None` when no
    /// key is applied.
    pub newest_applied_at_ms: Option<u64>,
}

/// Reads [`Stats`] of the database behind `conn` without writing. A database that never ran
/// idem (no schema) has zero keys.
///
/// One read statement over the whole table: its cost grows with the number of keys, so this
/// is for operators and audits, not for a request path.
///
/// # Errors
/// [`Error::Sqlite`] on a SQLite failure.
///
/// # Examples
/// ```
/// let mut conn = rusqlite::Connection::open_in_memory()?;
/// idem::once(&mut conn, "k1", 1, |_| Ok::<_, rusqlite::Error>(vec![]))?;
/// let _ = idem::once(&mut conn, "k2", 1, |_| Err::<Vec<u8>, _>("refused by the bank"));
/// let stats = idem::stats(&conn)?;
/// assert_eq!((stats.applied_keys, stats.failed_only_keys), (1, 1));
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
pub fn stats(conn: &Connection) -> Result<Stats, Error> {
    let row = conn
        .prepare_cached(
            "SELECT coalesce(sum(applied <> 0), 0), coalesce(sum(applied = 0), 0),
                    min(CASE WHEN applied <> 0 THEN at_ms END),
                    max(CASE WHEN applied <> 0 THEN at_ms END)
             FROM idem_keys",
        )
        .and_then(|mut s| {
            s.query_row([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                ))
            })
            .optional()
        });
    let Some((applied, failed_only, oldest, newest)) = optional_missing(row)? else {
        return Ok(Stats::default());
    };
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(Stats {
        applied_keys: count(applied),
        failed_only_keys: count(failed_only),
        oldest_applied_at_ms: oldest.map(count),
        newest_applied_at_ms: newest.map(count),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{ManualClock, Options};

    #[test]
    fn a_database_without_the_schema_has_no_keys() -> Result<(), Error> {
        let conn = Connection::open_in_memory()?;
        assert_eq!(stats(&conn)?, Stats::default());
        Ok(())
    }

    #[test]
    fn stats_count_applied_and_failed_only_keys_and_span_the_applied_times() -> Result<(), Error> {
        let mut conn = Connection::open_in_memory()?;
        let clock = Arc::new(ManualClock::new(1_000));
        let opts = Options::new().clock(clock.clone());
        let ok = |_: &rusqlite::Transaction<'_>| Ok::<_, rusqlite::Error>(vec![]);
        crate::once_with(&mut conn, "a", 1, &opts, ok)?;
        clock.set(5_000);
        crate::once_with(&mut conn, "b", 1, &opts, ok)?;
        clock.set(9_000);
        let refused = crate::once_with(&mut conn, "c", 1, &opts, |_| Err::<Vec<u8>, _>("refused"));
        assert!(matches!(refused, Err(Error::Apply { .. })));
        assert_eq!(
            stats(&conn)?,
            Stats {
                applied_keys: 2,
                failed_only_keys: 1,
                oldest_applied_at_ms: Some(1_000),
                newest_applied_at_ms: Some(5_000),
            }
        );
        Ok(())
    }
}
