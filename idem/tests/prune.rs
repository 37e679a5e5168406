//! Guards retention against prune deleting a row at or after its cutoff, a pruned key that
//! cannot run again, and a prune that fails on a database without the schema.

mod common;

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use common::{R, db};
use idem::Options;

#[test]
fn prune_deletes_rows_strictly_before_the_cutoff_and_a_pruned_key_runs_again() -> R {
    let (_d, _p, mut conn) = db()?;
    let n = idem::PRUNE_BATCH * 2 + 17; // spans several batches
    for i in 0..n {
        let t = if i % 2 == 0 { 1_000 } else { 5_000 };
        let opts = Options::new().clock(Arc::new(idem::ManualClock::new(t)));
        idem::once_with(&mut conn, &format!("key-{i:05}"), 1, &opts, |_| {
            Ok::<_, rusqlite::Error>(vec![])
        })?;
    }
    let old = n.div_ceil(2) as u64;
    let cutoff = UNIX_EPOCH + Duration::from_millis(5_000);
    assert_eq!(
        idem::prune(&mut conn, cutoff)?,
        old,
        "strictly before: 5000 stays"
    );
    assert_eq!(idem::prune(&mut conn, cutoff)?, 0);
    let left: i64 = conn.query_row("SELECT count(*) FROM idem_keys", [], |r| r.get(0))?;
    assert_eq!(left as u64, n as u64 - old);
    let again = idem::once(&mut conn, "key-00000", 1, |_| {
        Ok::<_, rusqlite::Error>(vec![])
    })?;
    assert!(again.applied, "a pruned key is forgotten and runs again");
    Ok(())
}

#[test]
fn prune_on_a_database_without_the_schema_deletes_nothing() -> R {
    let dir = tempfile::tempdir()?;
    let mut conn = rusqlite::Connection::open(dir.path().join("x.db"))?;
    assert_eq!(
        idem::prune(&mut conn, idem::Clock::now(&idem::SystemClock))?,
        0
    );
    Ok(())
}
