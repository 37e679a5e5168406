//! Guards I5 against failure bookkeeping overwriting an applied key or blocking a later
//! success, and against attempt limits that count wrongly.

mod common;

use common::{R, blocked_signal_conn, db, effects};
use idem::{Error, Options};
use rusqlite::Connection;

#[test]
fn stale_failure_never_overwrites_a_later_success() -> R {
    // Regression guard: attempt A fails while attempt B (another connection) is about to apply
    // the same key. A's failure bookkeeping must not turn B's applied row back. A counts its
    // attempt inside its own write transaction, so B waits for A's commit and then applies.
    let (_d, path, mut a) = db()?;
    let path_b = path.clone();
    let mut b_thread = None;
    let err = idem::once(&mut a, "k", 1, |_tx| {
        let (mut b, blocked) = blocked_signal_conn(&path_b)?;
        b_thread = Some(std::thread::spawn(move || {
            let out = idem::once(&mut b, "k", 1, |tx| {
                tx.execute("INSERT INTO effects VALUES ('k')", [])?;
                Ok::<_, rusqlite::Error>(b"from-b".to_vec())
            });
            (out.map_err(|e| e.to_string()), b)
        }));
        blocked.recv()?; // B is now waiting for A's write lock
        Err::<Vec<u8>, Box<dyn std::error::Error + Send + Sync>>("A failed".into())
    })
    .err()
    .ok_or("A's failure swallowed")?;
    assert!(matches!(err, Error::Apply { .. }), "{err:?}");
    let (b_out, b_conn) = b_thread
        .ok_or("B never started")?
        .join()
        .map_err(|_| "B panicked")?;
    let b_out = b_out?;
    assert!(b_out.applied, "B applied after A's failure committed");
    let rec = idem::applied(&b_conn, "k")?.ok_or("missing")?;
    assert_eq!(
        rec.result.as_deref(),
        Some(&b"from-b"[..]),
        "B's result stands"
    );
    assert_eq!(rec.attempts, 1, "A's one failed attempt is counted");
    assert_eq!(effects(&b_conn, "k")?, 1);
    // A later failure on the applied key cannot touch it: it is a replay, apply never runs.
    let again = idem::once(&mut a, "k", 1, |_| Err::<Vec<u8>, _>("late failure"))?;
    assert_eq!(again.result, b"from-b");
    assert_eq!(idem::applied(&a, "k")?.ok_or("missing")?.attempts, 1);
    Ok(())
}

#[test]
fn a_recorded_failure_never_blocks_a_later_success() -> R {
    let (_d, _p, mut conn) = db()?;
    for _ in 0..2 {
        let _ = idem::once(&mut conn, "k", 1, |_| Err::<Vec<u8>, _>("flaky"));
    }
    let out = idem::once(&mut conn, "k", 1, |tx| {
        tx.execute("INSERT INTO effects VALUES ('k')", [])?;
        Ok::<_, rusqlite::Error>(b"ok".to_vec())
    })?;
    assert!(out.applied);
    let rec = idem::applied(&conn, "k")?.ok_or("missing")?;
    assert_eq!((rec.attempts, rec.result.as_deref()), (2, Some(&b"ok"[..])));
    Ok(())
}

#[test]
fn exhausted_attempts_refuse_without_running_apply_until_cleared() -> R {
    let (_d, _p, mut conn) = db()?;
    let opts = Options::new().max_attempts(2);
    for i in 0..2 {
        let err = idem::once_with(&mut conn, "k", 1, &opts, |_| {
            Err::<Vec<u8>, _>(format!("failure {i}"))
        })
        .err()
        .ok_or("failure swallowed")?;
        assert!(matches!(err, Error::Apply { .. }));
    }
    let err = idem::once_with(&mut conn, "k", 1, &opts, |_| -> Result<Vec<u8>, String> {
        panic!("apply must not run once attempts are exhausted")
    })
    .err()
    .ok_or("exhausted key ran")?;
    match err {
        Error::AttemptsExhausted {
            attempts,
            last_error,
            ..
        } => {
            assert_eq!(attempts, 2);
            assert!(last_error.contains("failure 1"), "{last_error}");
        }
        other => return Err(format!("expected AttemptsExhausted, got {other:?}").into()),
    }
    assert!(idem::clear_failures(&conn, "k")?);
    assert!(idem::once_with(&mut conn, "k", 1, &opts, |_| Ok::<_, String>(vec![]))?.applied);
    assert!(
        !idem::clear_failures(&conn, "k")?,
        "an applied key is never cleared"
    );
    assert!(idem::applied(&conn, "k")?.ok_or("missing")?.is_applied());
    Ok(())
}

#[test]
fn busy_write_lock_is_a_retryable_error_and_apply_never_runs() -> R {
    let (_d, path, _conn) = db()?;
    let holder = Connection::open(&path)?;
    holder.execute_batch("BEGIN IMMEDIATE")?;
    let mut waiter = Connection::open(&path)?;
    waiter.busy_timeout(std::time::Duration::from_millis(20))?;
    let mut runs = 0;
    let err = idem::once(&mut waiter, "k", 1, |_| {
        runs += 1;
        Ok::<_, rusqlite::Error>(vec![])
    })
    .err()
    .ok_or("ran while the lock was held")?;
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(runs, 0);
    holder.execute_batch("COMMIT")?;
    assert!(idem::once(&mut waiter, "k", 1, |_| Ok::<_, rusqlite::Error>(vec![]))?.applied);
    Ok(())
}
