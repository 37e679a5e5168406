//! Guards I2–I4 against a key applied twice, a replay that differs from the stored result by
//! a byte, a different fingerprint accepted, and bad keys or stale rounds let through.

use idem::{Error, ErrorKind, Options};
use rusqlite::{Connection, Transaction};

type R = Result<(), Box<dyn std::error::Error>>;

fn db() -> Result<(tempfile::TempDir, Connection), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let conn = Connection::open(dir.path().join("t.db"))?;
    conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE effects (key TEXT NOT NULL)")?;
    Ok((dir, conn))
}

fn effect(
    key: &'static str,
    result: &'static [u8],
) -> impl Fn(&Transaction<'_>) -> rusqlite::Result<Vec<u8>> {
    move |tx| {
        tx.execute("INSERT INTO effects VALUES (?1)", [key])?;
        Ok(result.to_vec())
    }
}

fn effects(conn: &Connection, key: &str) -> rusqlite::Result<i64> {
    conn.query_row("SELECT count(*) FROM effects WHERE key = ?1", [key], |r| {
        r.get(0)
    })
}

#[test]
fn first_call_applies_and_later_calls_replay_without_running_apply() -> R {
    let (_d, mut conn) = db()?;
    let first = idem::once(&mut conn, "k", 3, effect("k", b"first"))?;
    assert!(first.applied);
    assert_eq!((first.result.as_slice(), first.round), (&b"first"[..], 3));
    for _ in 0..3 {
        let again = idem::once(&mut conn, "k", 4, |_| -> rusqlite::Result<Vec<u8>> {
            panic!("apply must not run on a replay")
        })?;
        assert!(!again.applied);
        assert_eq!(again.result, b"first");
        assert_eq!(again.round, 3, "the round of the first run");
        assert_eq!(again.applied_at_ms, first.applied_at_ms);
    }
    assert_eq!(effects(&conn, "k")?, 1);
    Ok(())
}

#[test]
fn empty_result_replays_as_empty_not_none() -> R {
    let (_d, mut conn) = db()?;
    idem::once(&mut conn, "empty", 1, effect("empty", b""))?;
    let again = idem::once(&mut conn, "empty", 1, effect("empty", b"x"))?;
    assert_eq!(again.result, Vec::<u8>::new());
    let rec = idem::applied(&conn, "empty")?.ok_or("record missing")?;
    assert_eq!(rec.result, Some(vec![]));
    let raw: Option<Vec<u8>> = conn.query_row(
        "SELECT result FROM idem_keys WHERE key = 'empty'",
        [],
        |r| r.get(0),
    )?;
    assert_eq!(raw, Some(vec![]), "stored as an empty BLOB, not NULL");
    Ok(())
}

#[test]
fn binary_result_is_byte_identical() -> R {
    let (_d, mut conn) = db()?;
    let bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let b2 = bytes.clone();
    idem::once(&mut conn, "bin", 1, move |_| Ok::<_, rusqlite::Error>(b2))?;
    let again = idem::once(&mut conn, "bin", 1, |_| Ok::<_, rusqlite::Error>(vec![]))?;
    assert_eq!(again.result, bytes);
    Ok(())
}

#[test]
fn keys_compare_byte_for_byte() -> R {
    let (_d, mut conn) = db()?;
    idem::once(&mut conn, "Key", 1, effect("Key", b"upper"))?;
    let lower = idem::once(&mut conn, "key", 1, effect("key", b"lower"))?;
    assert!(lower.applied, "BINARY collation: 'key' is not 'Key'");
    let padded = idem::once(&mut conn, "key ", 1, effect("key ", b"pad"))?;
    assert!(padded.applied);
    Ok(())
}

#[test]
fn bad_keys_are_refused_before_apply_runs() -> R {
    let (_d, mut conn) = db()?;
    let long = "x".repeat(256);
    for key in ["", "a\0b", long.as_str()] {
        let err = idem::once(&mut conn, key, 1, |_| -> rusqlite::Result<Vec<u8>> {
            panic!("apply must not run for a bad key")
        })
        .err()
        .ok_or("bad key accepted")?;
        assert!(matches!(err, Error::InvalidKey { .. }), "{err:?}");
        assert_eq!(err.kind(), ErrorKind::Input);
    }
    let max = "é".repeat(127); // 254 bytes
    assert!(idem::once(&mut conn, &max, 1, effect("m", b""))?.applied);
    Ok(())
}

#[test]
fn fingerprint_mismatch_is_refused_and_changes_nothing() -> R {
    let (_d, mut conn) = db()?;
    let a = Options::new().fingerprint(b"A".to_vec());
    let b = Options::new().fingerprint(b"B".to_vec());
    idem::once_with(&mut conn, "k", 1, &a, effect("k", b"r"))?;
    for opts in [&b, &Options::new()] {
        let err = idem::once_with(&mut conn, "k", 1, opts, effect("k", b"other"))
            .err()
            .ok_or("mismatch accepted")?;
        assert!(matches!(err, Error::FingerprintMismatch { .. }), "{err:?}");
    }
    assert_eq!(
        idem::once_with(&mut conn, "k", 1, &a, effect("k", b"x"))?.result,
        b"r"
    );
    assert_eq!(effects(&conn, "k")?, 1);
    let rec = idem::applied(&conn, "k")?.ok_or("missing")?;
    assert_eq!(rec.fingerprint.as_deref(), Some(&b"A"[..]));
    Ok(())
}

#[test]
fn strict_turns_a_replay_into_already_applied_with_the_stored_result() -> R {
    let (_d, mut conn) = db()?;
    assert_eq!(
        idem::once(&mut conn, "k", 1, effect("k", b"r"))?.strict()?,
        b"r"
    );
    match idem::once(&mut conn, "k", 1, effect("k", b"x"))?.strict() {
        Err(Error::AlreadyApplied { key, round, result }) => {
            assert_eq!(
                (key.as_str(), round, result.as_slice()),
                ("k", 1, &b"r"[..])
            );
        }
        other => return Err(format!("expected AlreadyApplied, got {other:?}").into()),
    }
    Ok(())
}

#[test]
fn a_round_below_the_highest_recorded_is_stale() -> R {
    let (_d, mut conn) = db()?;
    idem::once(&mut conn, "a", 5, effect("a", b""))?;
    let err = idem::once(&mut conn, "b", 4, effect("b", b""))
        .err()
        .ok_or("stale round accepted")?;
    match &err {
        Error::StaleRound { ours, highest, .. } => assert_eq!((*ours, *highest), (4, 5)),
        other => return Err(format!("expected StaleRound, got {other:?}").into()),
    }
    assert_eq!(err.kind(), ErrorKind::Reacquire);
    assert_eq!(effects(&conn, "b")?, 0);
    assert!(idem::once(&mut conn, "b", 6, effect("b", b""))?.applied);
    let err = idem::once(&mut conn, "c", u64::MAX, effect("c", b""))
        .err()
        .ok_or("accepted")?;
    assert!(matches!(err, Error::InvalidRound { .. }), "{err:?}");
    Ok(())
}

#[test]
fn applied_reads_the_record_without_writing() -> R {
    let (_d, mut conn) = db()?;
    assert_eq!(
        idem::applied(&conn, "k")?,
        None,
        "no schema yet is simply none"
    );
    let clock = std::sync::Arc::new(idem::ManualClock::new(1_700_000_000_123));
    let opts = Options::new().clock(clock).fingerprint(b"f".to_vec());
    idem::once_with(&mut conn, "k", 2, &opts, effect("k", b"res"))?;
    let rec = idem::applied(&conn, "k")?.ok_or("missing")?;
    assert!(rec.is_applied());
    assert_eq!(rec.result.as_deref(), Some(&b"res"[..]));
    assert_eq!(
        (rec.round, rec.applied_at_ms, rec.attempts),
        (2, Some(1_700_000_000_123), 0)
    );
    Ok(())
}

#[test]
fn once_refuses_a_connection_already_in_a_transaction() -> R {
    let (_d, mut conn) = db()?;
    conn.execute_batch("BEGIN")?;
    let err = idem::once(&mut conn, "k", 1, effect("k", b""))
        .err()
        .ok_or("accepted")?;
    assert!(matches!(err, Error::InTransaction), "{err:?}");
    Ok(())
}
