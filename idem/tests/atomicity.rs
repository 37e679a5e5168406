//! Guards I1 against a key row committed without apply's writes, or apply's writes kept
//! without the key row: after an error or a panic in `apply`, an oversized result, a failing
//! dedup write, or an `apply` that ends the transaction itself.

use idem::{Error, ErrorKind, Options};
use rusqlite::Connection;

type R = Result<(), Box<dyn std::error::Error>>;

fn db() -> Result<(tempfile::TempDir, Connection), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let conn = Connection::open(dir.path().join("t.db"))?;
    conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE effects (key TEXT NOT NULL)")?;
    Ok((dir, conn))
}

fn count(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT count(*) FROM effects", [], |r| r.get(0))
}

#[test]
fn an_error_from_apply_rolls_back_its_writes_and_counts_the_attempt() -> R {
    let (_d, mut conn) = db()?;
    let err = idem::once(&mut conn, "k", 1, |tx| {
        tx.execute("INSERT INTO effects VALUES ('k')", [])?;
        Err::<Vec<u8>, idem::BoxError>("card declined".into())
    })
    .err()
    .ok_or("error swallowed")?;
    assert!(matches!(err, Error::Apply { .. }), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::Rejected);
    assert_eq!(count(&conn)?, 0);
    let rec = idem::applied(&conn, "k")?.ok_or("attempt not counted")?;
    assert!(!rec.is_applied());
    assert_eq!(rec.attempts, 1);
    assert!(
        rec.last_error
            .as_deref()
            .unwrap_or("")
            .contains("card declined")
    );
    Ok(())
}

#[test]
fn a_panic_in_apply_rolls_everything_back() -> R {
    let (_d, mut conn) = db()?;
    let path = conn.path().ok_or("no path")?.to_owned();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = idem::once(&mut conn, "k", 1, |tx| -> rusqlite::Result<Vec<u8>> {
            tx.execute("INSERT INTO effects VALUES ('k')", [])?;
            panic!("bug in apply");
        });
    }));
    assert!(caught.is_err(), "the panic propagates");
    let fresh = Connection::open(path)?;
    assert_eq!(count(&fresh)?, 0);
    assert_eq!(idem::applied(&fresh, "k")?, None);
    assert!(idem::once(&mut conn, "k", 1, |_| Ok::<_, rusqlite::Error>(vec![1]))?.applied);
    Ok(())
}

#[test]
fn an_oversized_result_rolls_back_and_is_a_typed_error() -> R {
    let (_d, mut conn) = db()?;
    let opts = Options::new().max_result_bytes(16);
    let err = idem::once_with(&mut conn, "k", 1, &opts, |tx| {
        tx.execute("INSERT INTO effects VALUES ('k')", [])?;
        Ok::<_, rusqlite::Error>(vec![0; 17])
    })
    .err()
    .ok_or("oversized accepted")?;
    assert!(
        matches!(
            err,
            Error::ResultTooLarge {
                len: 17,
                limit: 16,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(count(&conn)?, 0);
    assert!(
        !idem::applied(&conn, "k")?
            .ok_or("not counted")?
            .is_applied()
    );
    Ok(())
}

#[test]
fn a_failing_dedup_write_rolls_back_apply_and_leaves_the_key_unapplied() -> R {
    let (_d, mut conn) = db()?;
    idem::ensure_schema(&conn)?;
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON idem_keys WHEN NEW.applied = 1
         BEGIN SELECT RAISE(ABORT, 'dedup write refused'); END;",
    )?;
    let err = idem::once(&mut conn, "k", 1, |tx| {
        tx.execute("INSERT INTO effects VALUES ('k')", [])?;
        Ok::<_, rusqlite::Error>(b"r".to_vec())
    })
    .err()
    .ok_or("dedup failure swallowed")?;
    assert!(matches!(err, Error::Sqlite(_)), "{err:?}");
    assert_eq!(count(&conn)?, 0);
    assert_eq!(idem::applied(&conn, "k")?, None);
    Ok(())
}

#[test]
fn apply_that_ends_the_transaction_itself_is_refused() -> R {
    let (_d, mut conn) = db()?;
    let err = idem::once(&mut conn, "k", 1, |tx| {
        tx.execute_batch("ROLLBACK")?;
        Ok::<_, rusqlite::Error>(vec![])
    })
    .err()
    .ok_or("accepted")?;
    assert!(matches!(err, Error::TransactionEnded { .. }), "{err:?}");
    assert_eq!(idem::applied(&conn, "k")?, None);
    Ok(())
}
