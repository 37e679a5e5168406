//! Guards against an effect key's records losing what happened: a result too large to keep
//! dropped without saying so, a settlement that could not be written lost with its result, a
//! lapsed reservation shown as still RESERVED to readers and resolvers, and a history that
//! forgets who did what and when.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{R, db};
use idem::Error;
use idem::effect::{self, Reserved, Resolution, Settlement, State};
use rusqlite::Connection;

const T0: u64 = 1_700_000_000_000;
const LEASE: u64 = 10_000;

fn opts(at: u64) -> effect::Options {
    effect::Options::new()
        .lease_ms(LEASE)
        .clock(Arc::new(idem::ManualClock::new(at)))
}

fn reserve(
    conn: &mut Connection,
    key: &str,
    o: &effect::Options,
) -> Result<effect::Reservation, common::BoxErr> {
    match effect::reserve(conn, key, o)? {
        Reserved::Reservation(r) => Ok(r),
        Reserved::Replay(_) => Err("replayed instead of reserving".into()),
    }
}

/// (state, actor, detail) of every recorded transition of `key`.
fn trail(conn: &Connection, key: &str) -> Result<Vec<(State, Option<String>, String)>, Error> {
    Ok(effect::history(conn, key)?
        .into_iter()
        .map(|t| (t.state, t.actor, t.detail.unwrap_or_default()))
        .collect())
}

#[test]
fn an_oversized_result_is_recorded_as_executed_without_it_and_never_runs_again() -> R {
    // Guards: a result larger than SQLite stores failed the settle after the charge with an
    // untyped error and left the key RESERVED, then AMBIGUOUS.
    let (_d, _p, mut conn) = db()?;
    let runs = Arc::new(AtomicUsize::new(0));
    let o = opts(T0).max_result_bytes(1024);
    let charge = |runs: &Arc<AtomicUsize>| {
        let runs = runs.clone();
        move || {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, effect::Error>(vec![7u8; 2048])
        }
    };
    let err = effect::run(&mut conn, "big", &o, charge(&runs))
        .err()
        .ok_or("an oversized result was kept")?;
    match &err {
        Error::EffectResultNotKept { result, reason, .. } => {
            assert_eq!(result.as_ref().map(effect::Output::len), Some(2048));
            assert!(
                reason.contains("2048") && reason.contains("1024"),
                "{reason}"
            );
        }
        other => panic!("expected EffectResultNotKept, got {other:?}"),
    }
    assert_eq!(err.effect_result().map(<[u8]>::len), Some(2048));
    let row = effect::get(&conn, "big")?.ok_or("no row")?;
    assert_eq!(row.state, State::Committed, "recorded as executed");
    assert!(row.result_not_kept(), "{row:?}");
    for at in [T0 + 1, T0 + 10 * LEASE] {
        let again = effect::run(&mut conn, "big", &opts(at), charge(&runs));
        assert!(
            matches!(again, Err(Error::EffectResultNotKept { result: None, .. })),
            "{again:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never a second execution");
    // Within the limit: kept and replayed byte for byte; an empty result stays empty.
    let out = effect::run(&mut conn, "small", &o, || Ok(vec![1u8; 1024]))?;
    assert_eq!(out.result.len(), 1024);
    let out = effect::run(&mut conn, "empty", &o, || Ok(Vec::new()))?;
    let replay = effect::run(&mut conn, "empty", &o, || Ok(b"x".to_vec()))?;
    assert!(out.executed && !replay.executed && replay.result.is_empty());
    // A resolution above the limit is refused, nothing written.
    let _ = effect::run(&mut conn, "amb", &o, || {
        Err(effect::Error::ambiguous("timeout"))
    });
    let err = effect::resolve_with(
        &mut conn,
        "amb",
        Resolution::Executed(vec![0; 4096]),
        "ops",
        T0 + 2,
        &o,
    )
    .err()
    .ok_or("an oversized resolution was written")?;
    assert!(
        matches!(
            err,
            Error::EffectResultTooLarge {
                len: 4096,
                limit: 1024,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), idem::ErrorKind::Input);
    assert_eq!(
        effect::get(&conn, "amb")?.map(|r| r.state),
        Some(State::Ambiguous)
    );
    Ok(())
}

#[test]
fn a_settle_sqlite_refuses_still_tells_the_caller_the_effect_ran() -> R {
    // Guards: "string or blob too big" after the charge was an untyped Fatal without the
    // result. Here the limit lets the result through and SQLite's own length limit refuses.
    let (_d, _p, mut conn) = db()?;
    let runs = Arc::new(AtomicUsize::new(0));
    let o = opts(T0).max_result_bytes(1 << 20);
    conn.set_limit(rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH, 4096)?;
    let counted = runs.clone();
    let err = effect::run(&mut conn, "k", &o, move || {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok(vec![b'r'; 8192])
    })
    .err()
    .ok_or("a result above SQLite's limit was stored")?;
    match &err {
        Error::EffectNotRecorded { result, source, .. } => {
            assert_eq!(result.len(), 8192);
            assert!(matches!(**source, Error::Sqlite(_)), "{source:?}");
        }
        other => panic!("expected EffectNotRecorded, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let row = effect::get(&conn, "k")?.ok_or("no row")?;
    assert_eq!(row.state, State::Reserved, "nothing overwritten");
    // After the lease, an operator resolves it with the result the error carried.
    let result = err.effect_result().ok_or("no result")?.to_vec();
    conn.set_limit(rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH, 1 << 30)?;
    let row = effect::resolve(
        &mut conn,
        "k",
        Resolution::Executed(result),
        "ops",
        row.lease_until_ms,
    )?;
    assert_eq!(
        (row.state, row.result.map(|r| r.len())),
        (State::Committed, Some(8192))
    );
    Ok(())
}

#[test]
fn a_lapsed_reservation_is_ambiguous_to_every_reader_and_resolvable() -> R {
    // Guards: a holder killed mid-executor left a RESERVED row that `effects --state
    // ambiguous` did not list and `resolve` refused ("it is reserved") when nobody called
    // the key again.
    let (_d, _p, mut conn) = db()?;
    let held = reserve(&mut conn, "pay", &opts(T0).holder("host-a"))?;
    let lapse = held.lease_until_ms();
    let before = opts(lapse - 1);
    let after = opts(lapse);
    let keys = |o: &effect::Options, s: State| -> Result<Vec<String>, Error> {
        Ok(effect::list_with(&conn, Some(s), o)?
            .into_iter()
            .map(|e| e.key)
            .collect())
    };
    assert_eq!(keys(&before, State::Reserved)?, ["pay"]);
    assert!(keys(&before, State::Ambiguous)?.is_empty());
    assert!(keys(&after, State::Reserved)?.is_empty());
    assert_eq!(keys(&after, State::Ambiguous)?, ["pay"]);
    let seen = effect::get_with(&conn, "pay", &after)?.ok_or("no row")?;
    assert_eq!(seen.state, State::Ambiguous);
    let why = seen.error.unwrap_or_default();
    assert_eq!(
        why.matches("host-a").count(),
        1,
        "names the holder once: {why}"
    );
    assert_eq!(
        effect::get(&conn, "pay")?.map(|r| r.state),
        Some(State::Reserved),
        "a read writes nothing"
    );

    // A live reservation is not resolvable (it may still be executing); a lapsed one is.
    let err = effect::resolve(
        &mut conn,
        "pay",
        Resolution::NotExecuted,
        "alice",
        lapse - 1,
    )
    .err()
    .ok_or("resolved a live reservation")?;
    assert!(matches!(err, Error::EffectInProgress { .. }), "{err:?}");
    let row = effect::resolve(
        &mut conn,
        "pay",
        Resolution::Executed(b"ch_1".to_vec()),
        "alice",
        lapse,
    )?;
    assert_eq!(
        (row.state, row.result.as_deref()),
        (State::Committed, Some(&b"ch_1"[..]))
    );
    // The holder's late settlement is refused, never overwrites, and hands back its result.
    let late = effect::settle(
        &mut conn,
        &held,
        Settlement::Executed(b"ch_1".to_vec()),
        &after,
    );
    assert!(
        matches!(&late, Err(Error::EffectNotRecorded { source, .. })
            if matches!(**source, Error::EffectLost { found: Some(State::Committed), .. })),
        "{late:?}"
    );
    let states: Vec<State> = trail(&conn, "pay")?.into_iter().map(|t| t.0).collect();
    assert_eq!(
        states,
        [State::Reserved, State::Ambiguous, State::Committed]
    );

    // The reconcile hook is offered lapsed reservations too.
    reserve(&mut conn, "pay-2", &opts(T0))?;
    let hook = |e: &effect::Effect| Some(Resolution::Executed(e.key.clone().into_bytes()));
    let done = effect::reconcile(&mut conn, &hook, "reconciler", lapse, &after)?;
    assert_eq!(
        done.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        ["pay-2"]
    );
    Ok(())
}

#[test]
fn a_lapse_rule_decides_every_path() -> R {
    // Guards: the lease was judged only by the row's stamp, which another host's clock
    // wrote (I15); a caller's own rule must decide reserve, reads and resolve alike.
    let (_d, _p, mut conn) = db()?;
    let held = reserve(&mut conn, "k", &opts(T0).holder("far-host"))?;
    let seen_at = held.lease_until_ms() + 5_000; // when this observer's own term ends
    let rule: effect::LapseFn = Arc::new(move |_row: &effect::Effect| seen_at);
    let judge = |at: u64| opts(at).lapse(rule.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let err = effect::run(&mut conn, "k", &judge(held.lease_until_ms()), move || {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok(b"x".to_vec())
    })
    .err()
    .ok_or("ran over a reservation the rule holds live")?;
    assert!(
        matches!(err, Error::EffectInProgress { lease_until_ms, .. } if lease_until_ms == seen_at),
        "{err:?}"
    );
    assert!(effect::list_with(&conn, Some(State::Ambiguous), &judge(seen_at - 1))?.is_empty());
    assert_eq!(
        effect::list_with(&conn, Some(State::Ambiguous), &judge(seen_at))?.len(),
        1
    );
    let err = effect::run(&mut conn, "k", &judge(seen_at), || Ok(b"x".to_vec()))
        .err()
        .ok_or("ran after the lapse")?;
    assert!(matches!(err, Error::EffectAmbiguous { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    Ok(())
}

#[test]
fn the_history_keeps_who_when_and_what_for_every_transition() -> R {
    // Guards: a resolved-committed row kept its old error text, and a re-run after
    // "not executed" erased who had decided.
    let (_d, _p, mut conn) = db()?;
    let _ = effect::run(&mut conn, "k", &opts(T0).holder("host-a"), || {
        Err(effect::Error::ambiguous("connection reset"))
    });
    effect::resolve(&mut conn, "k", Resolution::NotExecuted, "alice", T0 + 5)?;
    let out = effect::run(&mut conn, "k", &opts(T0 + 6).holder("host-b"), || {
        Ok(b"paid".to_vec())
    })?;
    assert!(out.executed);
    let row = effect::get(&conn, "k")?.ok_or("no row")?;
    assert_eq!((row.attempts, row.resolved_by.as_deref()), (2, None));
    let t = effect::history(&conn, "k")?;
    let who: Vec<(State, Option<&str>)> = t.iter().map(|t| (t.state, t.actor.as_deref())).collect();
    assert_eq!(
        who,
        [
            (State::Reserved, Some("host-a")),
            (State::Ambiguous, Some("host-a")),
            (State::Failed, Some("alice")),
            (State::Reserved, Some("host-b")),
            (State::Committed, Some("host-b")),
        ],
        "who decided survives the re-run"
    );
    assert_eq!(t.iter().map(|t| t.seq).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    assert_eq!(t[2].at_ms, T0 + 5, "when");
    assert!(
        t[1].detail
            .as_deref()
            .unwrap_or("")
            .contains("connection reset"),
        "what: {t:?}"
    );
    assert!(
        t[4].detail.as_deref().unwrap_or("").contains("4 bytes"),
        "{t:?}"
    );
    assert_ne!(t[0].attempt, t[3].attempt, "each reservation's own attempt");

    // A resolution as executed keeps no error text of the state it left.
    let _ = effect::run(&mut conn, "j", &opts(T0), || {
        Err(effect::Error::ambiguous("timeout"))
    });
    let row = effect::resolve(
        &mut conn,
        "j",
        Resolution::Executed(b"r".to_vec()),
        "bob",
        T0 + 1,
    )?;
    assert_eq!((row.error, row.resolved_by.as_deref()), (None, Some("bob")));
    assert!(
        trail(&conn, "j")?[1].2.contains("timeout"),
        "the history keeps it"
    );
    Ok(())
}

#[test]
fn a_database_whose_effects_predate_the_history_gets_it_at_the_first_write() -> R {
    // Guards the migration of schema version 1 databases written before the history column
    // (and the open-rows index) existed: reads work, the first write adds both.
    let (_d, _p, mut conn) = db()?;
    conn.execute_batch(
        "DROP INDEX idem_effects_open; DROP TABLE idem_effects;
         CREATE TABLE idem_effects (
             key TEXT PRIMARY KEY NOT NULL COLLATE BINARY, state TEXT NOT NULL,
             attempt BLOB NOT NULL, lease_until_ms INTEGER NOT NULL, result BLOB, error TEXT,
             created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL,
             attempts INTEGER NOT NULL, holder TEXT, resolved_by TEXT) WITHOUT ROWID;
         INSERT INTO idem_effects VALUES
             ('old', 'ambiguous', x'01', 1, NULL, 'timeout', 1, 1, 1, 'old-host', NULL);",
    )?;
    assert!(effect::history(&conn, "old")?.is_empty());
    assert_eq!(
        effect::list_with(&conn, Some(State::Ambiguous), &opts(T0))?.len(),
        1
    );
    effect::resolve(&mut conn, "old", Resolution::NotExecuted, "ops", T0 + 1)?;
    let has = |conn: &Connection, sql: &str| -> Result<i64, rusqlite::Error> {
        conn.query_row(sql, [], |r| r.get(0))
    };
    assert_eq!(
        has(
            &conn,
            "SELECT count(*) FROM pragma_table_info('idem_effects') WHERE name = 'history'"
        )?,
        1
    );
    assert_eq!(
        has(
            &conn,
            "SELECT count(*) FROM sqlite_schema WHERE name = 'idem_effects_open'"
        )?,
        1
    );
    assert_eq!(
        trail(&conn, "old")?.len(),
        1,
        "the history starts at the migration"
    );
    // A row the old shape wrote and the new one both read and run.
    let out = effect::run(&mut conn, "old", &opts(T0 + 2), || Ok(b"v".to_vec()))?;
    assert!(out.executed);
    assert_eq!(trail(&conn, "old")?.len(), 3);
    assert_eq!(
        has(
            &conn,
            "SELECT value FROM idem_meta WHERE name = 'schema_version'"
        )?,
        idem::SCHEMA_VERSION,
        "no version bump: older libraries still open it"
    );
    Ok(())
}

#[test]
fn effect_errors_print_each_part_once() -> R {
    // Guards: an error whose message already holds its source's text printed it twice.
    #[derive(Debug)]
    struct Refused;
    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("card declined")
        }
    }
    impl std::error::Error for Refused {}
    #[derive(Debug)]
    struct Wrapped(Refused);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "gateway: {}", self.0)
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    let (_d, _p, mut conn) = db()?;
    let _ = effect::run(&mut conn, "k", &opts(T0), || {
        Err(effect::Error::not_executed(Wrapped(Refused)))
    });
    let row = effect::get(&conn, "k")?.ok_or("no row")?;
    assert_eq!(row.error.as_deref(), Some("gateway: card declined"));
    reserve(&mut conn, "held", &opts(T0).holder("host-a"))?;
    let err = effect::run(&mut conn, "held", &opts(T0 + 1), || Ok(Vec::new()))
        .err()
        .ok_or("ran")?;
    let text = err.to_string();
    assert_eq!(text.matches("host-a").count(), 1, "{text}");
    Ok(())
}
