//! Guards external effects (reserve → execute → settle) against running an executor twice,
//! replaying a result that was not stored, and turning an unknown outcome into a retry. Each
//! test names the failure it guards against.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idem::Error;
use idem::effect::{self, Reserved, Resolution, Settlement};
use idem::failpoint::{FailPoint, Failpoints, Write};
use idem_base::lock;
use rusqlite::Connection;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const T0: u64 = 1_700_000_000_000;
const LEASE: u64 = 10_000;

fn clock(at: u64) -> Arc<idem::ManualClock> {
    Arc::new(idem::ManualClock::new(at))
}

/// Failpoints that injects at each point as many times as scripted, counts every visit, and can
/// run an action (another connection's write) when the re-read is about to happen.
#[derive(Default)]
struct Script {
    fail: Mutex<HashMap<FailPoint, u32>>,
    seen: Mutex<HashMap<FailPoint, u32>>,
    before_reread: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Script")
    }
}

impl Script {
    fn failing(points: &[(FailPoint, u32)]) -> Arc<Self> {
        let s = Script::default();
        lock(&s.fail).extend(points.iter().copied());
        Arc::new(s)
    }

    fn seen(&self, point: FailPoint) -> u32 {
        let seen = lock(&self.seen);
        seen.get(&point).copied().unwrap_or(0)
    }
}

impl Failpoints for Script {
    fn hit(&self, point: FailPoint) -> Result<(), String> {
        *lock(&self.seen).entry(point).or_insert(0) += 1;
        if matches!(point, FailPoint::BeforeReread(_)) {
            let action = lock(&self.before_reread).take();
            if let Some(action) = action {
                action();
            }
        }
        let mut fail = lock(&self.fail);
        match fail.get_mut(&point) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err("scripted".into())
            }
            _ => Ok(()),
        }
    }
}

fn db() -> Result<
    (tempfile::TempDir, std::path::PathBuf, Connection),
    Box<dyn std::error::Error + Send + Sync>,
> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("t.db");
    let conn = Connection::open(&path)?;
    conn.execute_batch("PRAGMA journal_mode=WAL")?;
    idem::ensure_schema(&conn)?;
    Ok((dir, path, conn))
}

fn opts(at: u64) -> effect::Options {
    effect::Options::new().lease_ms(LEASE).clock(clock(at))
}

/// An executor that counts its runs and returns `result`.
fn counting(
    runs: &Arc<AtomicUsize>,
    result: &'static [u8],
) -> impl FnOnce() -> Result<Vec<u8>, effect::Error> + use<> {
    let runs = runs.clone();
    move || {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(result.to_vec())
    }
}

fn state(conn: &Connection, key: &str) -> Result<Option<effect::State>, Error> {
    Ok(effect::get(conn, key)?.map(|e| e.state))
}

#[test]
fn an_effect_runs_once_and_replays_its_result() -> R {
    let (_d, _p, mut conn) = db()?;
    let runs = Arc::new(AtomicUsize::new(0));
    let first = effect::run(&mut conn, "pay-1", &opts(T0), counting(&runs, b""))?;
    let again = effect::run(&mut conn, "pay-1", &opts(T0 + 1), counting(&runs, b"x"))?;
    assert!(first.executed && !again.executed);
    assert_eq!(again.result, b"", "an empty result replays empty");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(state(&conn, "pay-1")?, Some(effect::State::Committed));
    Ok(())
}

#[test]
fn a_reserve_commit_that_landed_but_reported_an_error_is_ours() -> R {
    // Guards: a landed reservation reported as failed must be recognised by the re-read,
    // not returned as an error (or re-inserted).
    let (_d, _p, mut conn) = db()?;
    let script = Script::failing(&[(FailPoint::AfterCommit(Write::Reserve), 1)]);
    let runs = Arc::new(AtomicUsize::new(0));
    let out = effect::run(
        &mut conn,
        "k",
        &opts(T0).failpoints(script.clone()),
        counting(&runs, b"ok"),
    )?;
    assert!(out.executed);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(script.seen(FailPoint::BeforeReread(Write::Reserve)), 1);
    assert_eq!(
        script.seen(FailPoint::BeforeCommit(Write::Reserve)),
        1,
        "no second insert"
    );
    assert_eq!(state(&conn, "k")?, Some(effect::State::Committed));
    Ok(())
}

#[test]
fn a_reserve_commit_that_did_not_land_retries_the_insert_once() -> R {
    let (_d, _p, mut conn) = db()?;
    let script = Script::failing(&[(FailPoint::BeforeCommit(Write::Reserve), 1)]);
    let runs = Arc::new(AtomicUsize::new(0));
    let out = effect::run(
        &mut conn,
        "k",
        &opts(T0).failpoints(script.clone()),
        counting(&runs, b"ok"),
    )?;
    assert!(out.executed);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(script.seen(FailPoint::BeforeCommit(Write::Reserve)), 2);
    Ok(())
}

#[test]
fn a_reserve_commit_that_never_lands_is_retried_exactly_once() -> R {
    let (_d, _p, mut conn) = db()?;
    let script = Script::failing(&[(FailPoint::BeforeCommit(Write::Reserve), 99)]);
    let runs = Arc::new(AtomicUsize::new(0));
    let err = effect::run(
        &mut conn,
        "k",
        &opts(T0).failpoints(script.clone()),
        counting(&runs, b"ok"),
    )
    .err()
    .ok_or("false success")?;
    assert!(matches!(err, Error::EffectCommitFailed { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(script.seen(FailPoint::BeforeCommit(Write::Reserve)), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(state(&conn, "k")?, None, "nothing written");
    Ok(())
}

#[test]
fn a_row_with_our_attempt_id_but_other_columns_is_not_ours() -> R {
    // Guards: the re-read must compare the whole row. Another caller reused our attempt id and
    // reserved the key while our COMMIT failed; matching the id alone would run our executor
    // beside theirs.
    let (_d, path, mut conn) = db()?;
    let id = [7u8; 16];
    let script = Script::failing(&[(FailPoint::BeforeCommit(Write::Reserve), 1)]);
    let other_path = path.clone();
    *lock(&script.before_reread) = Some(Box::new(move || {
        let mut other = Connection::open(other_path).expect("open second connection");
        let theirs = effect::Options::new()
            .lease_ms(LEASE)
            .clock(clock(T0 - 5))
            .attempt_id(id)
            .holder("someone-else");
        let got = effect::reserve(&mut other, "k", &theirs);
        assert!(matches!(got, Ok(Reserved::Reservation(_))), "{got:?}");
    }));
    let runs = Arc::new(AtomicUsize::new(0));
    let ours = opts(T0).attempt_id(id).failpoints(script.clone());
    let err = effect::run(&mut conn, "k", &ours, counting(&runs, b"ours"))
        .err()
        .ok_or("treated another attempt's row as ours")?;
    match err {
        Error::EffectInProgress { holder, .. } => assert_eq!(holder, "someone-else"),
        other => panic!("expected EffectInProgress, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let row = effect::get(&conn, "k")?.ok_or("no row")?;
    assert_eq!(row.holder.as_deref(), Some("someone-else"));
    Ok(())
}

#[test]
fn a_settlement_whose_commit_did_not_land_is_reissued_once() -> R {
    let (_d, _p, mut conn) = db()?;
    let script = Script::failing(&[(FailPoint::BeforeCommit(Write::Settle), 1)]);
    let runs = Arc::new(AtomicUsize::new(0));
    let out = effect::run(
        &mut conn,
        "k",
        &opts(T0).failpoints(script.clone()),
        counting(&runs, b"ok"),
    )?;
    assert!(out.executed);
    assert_eq!(script.seen(FailPoint::BeforeCommit(Write::Settle)), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(state(&conn, "k")?, Some(effect::State::Committed));
    Ok(())
}

#[test]
fn a_settlement_that_never_lands_is_reissued_only_once() -> R {
    let (_d, _p, mut conn) = db()?;
    let script = Script::failing(&[(FailPoint::BeforeCommit(Write::Settle), 99)]);
    let runs = Arc::new(AtomicUsize::new(0));
    let err = effect::run(
        &mut conn,
        "k",
        &opts(T0).failpoints(script.clone()),
        counting(&runs, b"ok"),
    )
    .err()
    .ok_or("false success")?;
    // The executor ran: the error says so and carries its result, with the commit
    // failure as its source.
    match &err {
        Error::EffectNotRecorded { result, source, .. } => {
            assert_eq!(result.as_bytes(), b"ok");
            assert!(
                matches!(**source, Error::EffectCommitFailed { .. }),
                "{source:?}"
            );
        }
        other => panic!("expected EffectNotRecorded, got {other:?}"),
    }
    assert_eq!(err.effect_result(), Some(&b"ok"[..]));
    assert_eq!(script.seen(FailPoint::BeforeCommit(Write::Settle)), 2);
    assert_eq!(state(&conn, "k")?, Some(effect::State::Reserved));
    // The key is never re-run: after the lease it is AMBIGUOUS.
    let err = effect::run(&mut conn, "k", &opts(T0 + LEASE), counting(&runs, b"x"))
        .err()
        .ok_or("re-ran")?;
    assert!(matches!(err, Error::EffectAmbiguous { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

#[test]
fn a_settlement_that_landed_but_reported_an_error_is_ours() -> R {
    let (_d, _p, mut conn) = db()?;
    let script = Script::failing(&[(FailPoint::AfterCommit(Write::Settle), 1)]);
    let runs = Arc::new(AtomicUsize::new(0));
    let out = effect::run(
        &mut conn,
        "k",
        &opts(T0).failpoints(script.clone()),
        counting(&runs, b"ok"),
    )?;
    assert_eq!(out.result, b"ok");
    assert_eq!(script.seen(FailPoint::BeforeCommit(Write::Settle)), 1);
    Ok(())
}

#[test]
fn a_failed_reread_writes_nothing_and_never_runs_the_executor() -> R {
    let (_d, _p, mut conn) = db()?;
    let script = Script::failing(&[
        (FailPoint::BeforeCommit(Write::Reserve), 1),
        (FailPoint::BeforeReread(Write::Reserve), 1),
    ]);
    let runs = Arc::new(AtomicUsize::new(0));
    let err = effect::run(
        &mut conn,
        "k",
        &opts(T0).failpoints(script.clone()),
        counting(&runs, b"ok"),
    )
    .err()
    .ok_or("false success")?;
    assert!(matches!(err, Error::EffectCommitUnknown { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(script.seen(FailPoint::BeforeCommit(Write::Reserve)), 1);
    assert_eq!(state(&conn, "k")?, None, "nothing written");
    Ok(())
}

#[test]
fn a_failed_reread_after_a_landed_reservation_ends_ambiguous_not_rerun() -> R {
    let (_d, _p, mut conn) = db()?;
    let script = Script::failing(&[
        (FailPoint::AfterCommit(Write::Reserve), 1),
        (FailPoint::BeforeReread(Write::Reserve), 1),
    ]);
    let runs = Arc::new(AtomicUsize::new(0));
    let err = effect::run(
        &mut conn,
        "k",
        &opts(T0).failpoints(script.clone()),
        counting(&runs, b"ok"),
    )
    .err()
    .ok_or("false success")?;
    assert!(matches!(err, Error::EffectCommitUnknown { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(state(&conn, "k")?, Some(effect::State::Reserved));
    let err = effect::run(&mut conn, "k", &opts(T0 + 1), counting(&runs, b"x"))
        .err()
        .ok_or("ran during the lease")?;
    assert!(matches!(err, Error::EffectInProgress { .. }), "{err:?}");
    let err = effect::run(&mut conn, "k", &opts(T0 + LEASE), counting(&runs, b"x"))
        .err()
        .ok_or("ran after the lease")?;
    assert!(matches!(err, Error::EffectAmbiguous { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    Ok(())
}

#[test]
fn busy_reported_in_band_retries_the_write() -> R {
    let (_d, _p, mut conn) = db()?;
    let script = Script::failing(&[(FailPoint::Busy(Write::Reserve), 1)]);
    let runs = Arc::new(AtomicUsize::new(0));
    let out = effect::run(
        &mut conn,
        "k",
        &opts(T0).failpoints(script.clone()),
        counting(&runs, b"ok"),
    )?;
    assert!(out.executed);
    assert_eq!(script.seen(FailPoint::Busy(Write::Reserve)), 2);
    assert_eq!(
        script.seen(FailPoint::BeforeReread(Write::Reserve)),
        0,
        "busy is not an unknown outcome"
    );
    Ok(())
}

#[test]
fn not_executed_fails_the_key_and_a_retry_reserves_and_executes_once() -> R {
    let (_d, _p, mut conn) = db()?;
    let err = effect::run(&mut conn, "k", &opts(T0), || {
        Err(effect::Error::not_executed("card declined before capture"))
    })
    .err()
    .ok_or("false success")?;
    assert!(matches!(err, Error::EffectNotExecuted { .. }), "{err:?}");
    assert_eq!(state(&conn, "k")?, Some(effect::State::Failed));
    let runs = Arc::new(AtomicUsize::new(0));
    let out = effect::run(&mut conn, "k", &opts(T0 + 1), counting(&runs, b"paid"))?;
    assert!(out.executed);
    let out = effect::run(&mut conn, "k", &opts(T0 + 2), counting(&runs, b"again"))?;
    assert_eq!((out.executed, out.result.as_slice()), (false, &b"paid"[..]));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let row = effect::get(&conn, "k")?.ok_or("no row")?;
    assert_eq!(row.attempts, 2);
    Ok(())
}

#[test]
fn any_other_error_is_ambiguous_and_no_retry_clears_it() -> R {
    let (_d, _p, mut conn) = db()?;
    let err = effect::run(&mut conn, "k", &opts(T0), || {
        Err(effect::Error::ambiguous(
            "connection reset after the request was sent",
        ))
    })
    .err()
    .ok_or("false success")?;
    assert!(matches!(err, Error::EffectAmbiguous { .. }), "{err:?}");
    let runs = Arc::new(AtomicUsize::new(0));
    for at in [T0 + 1, T0 + 10 * LEASE] {
        let err = effect::run(&mut conn, "k", &opts(at), counting(&runs, b"x"))
            .err()
            .ok_or("re-ran an ambiguous effect")?;
        assert!(matches!(err, Error::EffectAmbiguous { .. }), "{err:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    Ok(())
}

#[test]
fn a_panicking_executor_leaves_the_key_ambiguous_and_the_panic_propagates() -> R {
    let (_d, _p, mut conn) = db()?;
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        effect::run(
            &mut conn,
            "k",
            &opts(T0),
            || -> Result<Vec<u8>, effect::Error> { panic!("boom") },
        )
    }));
    assert!(caught.is_err(), "the panic propagates");
    let row = effect::get(&conn, "k")?.ok_or("no row")?;
    assert_eq!(row.state, effect::State::Ambiguous);
    assert!(row.error.unwrap_or_default().contains("boom"));
    Ok(())
}

#[test]
fn a_live_lease_is_in_progress_and_a_lapsed_one_turns_ambiguous_never_rerun() -> R {
    let (_d, _p, mut conn) = db()?;
    let Reserved::Reservation(held) = effect::reserve(&mut conn, "k", &opts(T0).holder("A"))?
    else {
        return Err("no reservation".into());
    };
    let runs = Arc::new(AtomicUsize::new(0));
    match effect::run(&mut conn, "k", &opts(T0 + LEASE - 1), counting(&runs, b"x")) {
        Err(Error::EffectInProgress {
            holder,
            lease_until_ms,
            ..
        }) => assert_eq!((holder.as_str(), lease_until_ms), ("A", T0 + LEASE)),
        other => panic!("expected EffectInProgress, got {other:?}"),
    }
    let err = effect::run(&mut conn, "k", &opts(T0 + LEASE), counting(&runs, b"x"))
        .err()
        .ok_or("a lapsed lease was re-run")?;
    assert!(matches!(err, Error::EffectAmbiguous { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The late holder's settlement fails its conditional UPDATE and says so, handing back
    // the result it could not record (an operator resolves with it).
    let late = effect::settle(
        &mut conn,
        &held,
        Settlement::Executed(b"late".to_vec()),
        &opts(T0 + LEASE + 1),
    );
    match &late {
        Err(Error::EffectNotRecorded { result, source, .. }) => {
            assert_eq!(result.as_bytes(), b"late");
            assert!(
                matches!(
                    **source,
                    Error::EffectLost {
                        found: Some(effect::State::Ambiguous),
                        ..
                    }
                ),
                "{source:?}"
            );
        }
        other => panic!("expected EffectNotRecorded, got {other:?}"),
    }
    assert_eq!(state(&conn, "k")?, Some(effect::State::Ambiguous));
    Ok(())
}

#[test]
fn an_operator_resolves_ambiguous_effects_with_who_and_when() -> R {
    let (_d, _p, mut conn) = db()?;
    for key in ["a", "b", "c"] {
        let _ = effect::run(&mut conn, key, &opts(T0), || {
            Err(effect::Error::ambiguous("timeout"))
        });
    }
    let listed: Vec<_> = effect::list(&conn, Some(effect::State::Ambiguous))?
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(listed, ["a", "b", "c"]);

    let row = effect::resolve(
        &mut conn,
        "a",
        Resolution::Executed(b"r".to_vec()),
        "ops@x",
        T0 + 5,
    )?;
    assert_eq!(
        (row.state, row.resolved_by.as_deref(), row.updated_ms),
        (effect::State::Committed, Some("ops@x"), T0 + 5)
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let out = effect::run(&mut conn, "a", &opts(T0 + 6), counting(&runs, b"x"))?;
    assert_eq!((out.executed, out.result.as_slice()), (false, &b"r"[..]));

    effect::resolve(&mut conn, "b", Resolution::NotExecuted, "ops@x", T0 + 5)?;
    let out = effect::run(&mut conn, "b", &opts(T0 + 6), counting(&runs, b"b"))?;
    assert!(out.executed, "a resolved-not-executed key runs again");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let err = effect::resolve(&mut conn, "a", Resolution::NotExecuted, "ops@x", T0 + 7)
        .err()
        .ok_or("resolved a committed effect")?;
    assert!(
        matches!(
            err,
            Error::EffectNotAmbiguous {
                state: Some(effect::State::Committed),
                ..
            }
        ),
        "{err:?}"
    );

    // The reconcile hook decides what it can and leaves the rest.
    let hook = |e: &effect::Effect| (e.key == "c").then(|| Resolution::Executed(b"c".to_vec()));
    let done = effect::reconcile(
        &mut conn,
        &hook,
        "reconciler",
        T0 + 8,
        &effect::Options::new(),
    )?;
    assert_eq!(done.len(), 1);
    assert_eq!(
        effect::list(&conn, Some(effect::State::Ambiguous))?.len(),
        0
    );
    assert_eq!(effect::list(&conn, None)?.len(), 3);
    Ok(())
}

#[test]
fn a_schema_version_1_database_without_the_effects_table_gets_it_on_first_reserve() -> R {
    let dir = tempfile::tempdir()?;
    let mut conn = Connection::open(dir.path().join("old.db"))?;
    idem::ensure_schema(&conn)?;
    conn.execute_batch("DROP TABLE idem_effects")?; // as written by a version before effects
    idem::ensure_schema(&conn)?;
    assert!(effect::list(&conn, None)?.is_empty());
    let out = effect::run(&mut conn, "k", &opts(T0), || Ok(b"v".to_vec()))?;
    assert!(out.executed);
    Ok(())
}

#[test]
fn the_write_hook_commits_with_every_transition() -> R {
    let (_d, _p, mut conn) = db()?;
    conn.execute_batch("CREATE TABLE bumps (n INTEGER)")?;
    let hook: effect::WriteHook =
        Arc::new(|c: &Connection| c.execute("INSERT INTO bumps VALUES (1)", []).map(|_| ()));
    let o = opts(T0).on_write(hook);
    effect::run(&mut conn, "k", &o, || Ok(b"v".to_vec()))?;
    effect::run(&mut conn, "k", &o, || Ok(b"v".to_vec()))?; // replay: no write
    let n: i64 = conn.query_row("SELECT count(*) FROM bumps", [], |r| r.get(0))?;
    assert_eq!(n, 2, "reserve and settle");
    Ok(())
}
