//! Guards I9 against guessing the outcome of a failed COMMIT: it is settled by re-reading the
//! whole row, attempt id included, so another attempt's row is never taken for ours.

mod common;

use std::sync::Arc;

use common::{FnFailpoints, R, db, effects};
use idem::failpoint::{FailPoint, Write};
use idem::{Error, Options};
use rusqlite::Connection;

fn write(key: &'static str) -> impl Fn(&rusqlite::Transaction<'_>) -> rusqlite::Result<Vec<u8>> {
    move |tx| {
        tx.execute("INSERT INTO effects VALUES (?1)", [key])?;
        Ok(b"ours".to_vec())
    }
}

#[test]
fn commit_that_landed_but_reported_an_error_is_ours() -> R {
    let (_d, _p, mut conn) = db()?;
    let failpoints = FnFailpoints(|p| {
        if p == FailPoint::AfterCommit(Write::Once) {
            Err("injected".into())
        } else {
            Ok(())
        }
    });
    let opts = Options::new().failpoints(Arc::new(failpoints));
    let out = idem::once_with(&mut conn, "k", 1, &opts, write("k"))?;
    assert!(out.applied, "the re-read found our own row");
    assert_eq!(out.result, b"ours");
    assert_eq!(effects(&conn, "k")?, 1);
    Ok(())
}

#[test]
fn commit_that_rolled_back_is_a_safe_to_retry_error() -> R {
    let (_d, _p, mut conn) = db()?;
    let failpoints = FnFailpoints(|p| {
        if p == FailPoint::BeforeCommit(Write::Once) {
            Err("injected".into())
        } else {
            Ok(())
        }
    });
    let opts = Options::new().failpoints(Arc::new(failpoints));
    let err = idem::once_with(&mut conn, "k", 1, &opts, write("k"))
        .err()
        .ok_or("false success")?;
    assert!(matches!(err, Error::CommitFailed { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(effects(&conn, "k")?, 0);
    assert!(
        idem::once(&mut conn, "k", 1, write("k"))?.applied,
        "the retry applies"
    );
    Ok(())
}

#[test]
fn a_real_sqlite_commit_failure_is_settled_by_the_reread() -> R {
    let (_d, _p, mut conn) = db()?;
    conn.commit_hook(Some(|| true))?; // SQLite turns the COMMIT into a rollback
    let err = idem::once(&mut conn, "k", 1, write("k"))
        .err()
        .ok_or("false success")?;
    assert!(matches!(err, Error::CommitFailed { .. }), "{err:?}");
    conn.commit_hook(None::<fn() -> bool>)?;
    assert_eq!(effects(&conn, "k")?, 0);
    assert_eq!(idem::applied(&conn, "k")?, None);
    Ok(())
}

#[test]
fn a_row_with_our_attempt_id_but_another_result_is_not_ours() -> R {
    // Compare the whole row, never the attempt id alone: another call reusing our attempt id
    // (ids can be caller-supplied) applied the key with its own result while our COMMIT failed.
    let (_d, path, mut conn) = db()?;
    let id = [7u8; 16];
    let other_path = path.clone();
    let failpoints = FnFailpoints(move |p| match p {
        FailPoint::BeforeCommit(Write::Once) => Err("injected".into()),
        FailPoint::BeforeReread(Write::Once) => {
            let mut other = Connection::open(&other_path).map_err(|e| e.to_string())?;
            let opts = Options::new().attempt_id(id);
            idem::once_with(&mut other, "k", 1, &opts, |tx| {
                tx.execute("INSERT INTO effects VALUES ('k')", [])?;
                Ok::<_, rusqlite::Error>(b"theirs".to_vec())
            })
            .map_err(|e| e.to_string())?;
            Ok(())
        }
        _ => Ok(()),
    });
    let opts = Options::new()
        .attempt_id(id)
        .failpoints(Arc::new(failpoints));
    let out = idem::once_with(&mut conn, "k", 1, &opts, write("k"))?;
    assert!(
        !out.applied,
        "another call's row is a replay, not our success"
    );
    assert_eq!(out.result, b"theirs");
    assert_eq!(effects(&conn, "k")?, 1);
    Ok(())
}

#[test]
fn fingerprint_is_checked_on_the_reread_path() -> R {
    let (_d, path, mut conn) = db()?;
    let other_path = path.clone();
    let failpoints = FnFailpoints(move |p| match p {
        FailPoint::BeforeCommit(Write::Once) => Err("injected".into()),
        FailPoint::BeforeReread(Write::Once) => {
            let mut other = Connection::open(&other_path).map_err(|e| e.to_string())?;
            let opts = Options::new().fingerprint(b"theirs".to_vec());
            idem::once_with(&mut other, "k", 1, &opts, |_| {
                Ok::<_, rusqlite::Error>(vec![])
            })
            .map_err(|e| e.to_string())?;
            Ok(())
        }
        _ => Ok(()),
    });
    let opts = Options::new()
        .fingerprint(b"ours".to_vec())
        .failpoints(Arc::new(failpoints));
    let err = idem::once_with(&mut conn, "k", 1, &opts, write("k"))
        .err()
        .ok_or("accepted")?;
    assert!(matches!(err, Error::FingerprintMismatch { .. }), "{err:?}");
    Ok(())
}

#[test]
fn a_failed_reread_is_commit_unknown_and_writes_nothing() -> R {
    let (_d, _p, mut conn) = db()?;
    let failpoints = FnFailpoints(|p| match p {
        FailPoint::BeforeCommit(Write::Once) | FailPoint::BeforeReread(Write::Once) => {
            Err("injected".into())
        }
        _ => Ok(()),
    });
    let opts = Options::new().failpoints(Arc::new(failpoints));
    let err = idem::once_with(&mut conn, "k", 1, &opts, write("k"))
        .err()
        .ok_or("accepted")?;
    assert!(matches!(err, Error::CommitUnknown { .. }), "{err:?}");
    assert_eq!(effects(&conn, "k")?, 0);
    assert_eq!(
        idem::applied(&conn, "k")?,
        None,
        "nothing written, not even a failure count"
    );
    Ok(())
}

#[test]
fn fingerprint_is_checked_on_the_conflict_path() -> R {
    // B waits for A's write lock while A applies the key; B must check the fingerprint on the
    // row it finds once it holds the lock.
    let (_d, path, mut a) = db()?;
    let path_b = path.clone();
    let mut b_thread = None;
    idem::once_with(
        &mut a,
        "k",
        1,
        &Options::new().fingerprint(b"A".to_vec()),
        |_| {
            let (mut b, blocked) = common::blocked_signal_conn(&path_b)?;
            b_thread = Some(std::thread::spawn(move || {
                let opts = Options::new().fingerprint(b"B".to_vec());
                idem::once_with(&mut b, "k", 1, &opts, |_| Ok::<_, rusqlite::Error>(vec![]))
                    .map_err(|e| format!("{e:?}"))
            }));
            blocked.recv()?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(b"a".to_vec())
        },
    )?;
    let b = b_thread
        .ok_or("B never started")?
        .join()
        .map_err(|_| "B panicked")?;
    let err = b.err().ok_or("B's mismatch accepted")?;
    assert!(err.starts_with("FingerprintMismatch"), "{err}");
    Ok(())
}
