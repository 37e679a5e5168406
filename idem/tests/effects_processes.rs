//! Guards external effects across real OS processes against two processes executing one key
//! in a race, and against a SIGKILL mid-executor leaving the key anything but AMBIGUOUS.
//!
//! The test binary re-runs itself as the child (`--exact effect_child --nocapture`); the child
//! does nothing unless `IDEM_EFFECT_CHILD` is set. libtest prints "test effect_child ... "
//! before the child's first line, so lines are matched with `ends_with`.

use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem::Error;
use idem::effect;
use rusqlite::Connection;

type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const KEY: &str = "charge-9";
const LEASE: u64 = 60_000;

fn spawn(mode: &str, db: &std::path::Path, log: &std::path::Path) -> std::io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .args(["--exact", "effect_child", "--nocapture", "--test-threads=1"])
        .env("IDEM_EFFECT_CHILD", mode)
        .env("IDEM_EFFECT_DB", db)
        .env("IDEM_EFFECT_LOG", log)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
}

fn open(db: &std::path::Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(db)?;
    conn.busy_timeout(Duration::from_secs(30))?;
    conn.execute_batch("PRAGMA journal_mode=WAL;")?;
    Ok(conn)
}

/// The executor's side effect: one line appended (O_APPEND) to the log file per execution.
fn execute(log: &std::path::Path) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    writeln!(f, "executed by {}", std::process::id())?;
    f.sync_all()
}

fn executions(log: &std::path::Path) -> std::io::Result<usize> {
    match std::fs::read_to_string(log) {
        Ok(s) => Ok(s.lines().count()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Reads lines until one ends with `word`; returns the line.
fn wait_for(lines: &mut Lines<BufReader<ChildStdout>>, word: &str) -> Result<String, String> {
    loop {
        match lines.next() {
            Some(Ok(line)) if line.ends_with(word) => return Ok(line),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err(format!("child exited before {word:?}")),
        }
    }
}

#[test]
fn effect_child() -> R {
    let (Ok(mode), Ok(db), Ok(log)) = (
        std::env::var("IDEM_EFFECT_CHILD"),
        std::env::var("IDEM_EFFECT_DB"),
        std::env::var("IDEM_EFFECT_LOG"),
    ) else {
        return Ok(());
    };
    let mut conn = open(db.as_ref())?;
    idem::ensure_schema(&conn)?;
    println!("ready");
    // Start together: the parent writes one line to every child once all are ready.
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let opts = effect::Options::new()
        .lease_ms(LEASE)
        .holder(format!("pid {}", std::process::id()));
    let out = effect::run(&mut conn, KEY, &opts, || {
        execute(log.as_ref()).map_err(effect::Error::ambiguous)?;
        if mode == "hang" {
            println!("executing");
            loop {
                std::thread::park(); // SIGKILLed here, mid-executor
            }
        }
        Ok(b"charged".to_vec())
    });
    match out {
        Ok(o) if o.executed => println!("won"),
        Ok(_) => println!("replayed"),
        Err(Error::EffectInProgress { .. }) => println!("in-progress"),
        Err(e) => println!("error {e}"),
    }
    Ok(())
}

#[test]
fn two_processes_reserving_the_same_key_at_once_have_one_winner() -> R {
    let dir = tempfile::tempdir()?;
    let (db, log) = (dir.path().join("race.db"), dir.path().join("executed.log"));
    drop(open(&db)?);
    for _ in 0..5 {
        let _ = std::fs::remove_file(&log);
        open(&db)?.execute_batch("DROP TABLE IF EXISTS idem_effects")?;
        let mut children = (0..2)
            .map(|_| spawn("race", &db, &log))
            .collect::<Result<Vec<_>, _>>()?;
        let mut readers = Vec::new();
        for child in &mut children {
            let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
            wait_for(&mut lines, "ready")?;
            readers.push(lines);
        }
        for child in &mut children {
            writeln!(child.stdin.take().ok_or("no stdin")?, "go")?;
        }
        let mut answers = Vec::new();
        for lines in readers {
            let rest = lines.collect::<Result<Vec<_>, _>>()?;
            let answer = rest
                .into_iter()
                .find(|l| {
                    ["won", "in-progress", "replayed"]
                        .iter()
                        .any(|w| l.ends_with(w))
                        || l.contains("error ")
                })
                .ok_or("a child gave no answer")?;
            answers.push(answer);
        }
        for child in &mut children {
            assert!(child.wait()?.success(), "a racing child failed");
        }
        let won = answers.iter().filter(|a| a.ends_with("won")).count();
        assert_eq!(won, 1, "one winner: {answers:?}");
        assert!(!answers.iter().any(|a| a.contains("error ")), "{answers:?}");
        assert_eq!(executions(&log)?, 1, "exactly one process executed");
        let row = effect::get(&open(&db)?, KEY)?.ok_or("no row")?;
        assert_eq!(row.state, effect::State::Committed);
    }
    Ok(())
}

#[test]
fn sigkill_mid_executor_turns_ambiguous_after_the_lease_and_never_reruns() -> R {
    let dir = tempfile::tempdir()?;
    let (db, log) = (dir.path().join("kill.db"), dir.path().join("executed.log"));
    drop(open(&db)?);
    let mut child = spawn("hang", &db, &log)?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    wait_for(&mut lines, "ready")?;
    writeln!(child.stdin.take().ok_or("no stdin")?, "go")?;
    wait_for(&mut lines, "executing")?;
    child.kill()?; // SIGKILL while the executor runs
    child.wait()?;
    assert_eq!(executions(&log)?, 1);

    let mut conn = open(&db)?;
    let row = effect::get(&conn, KEY)?.ok_or("no row")?;
    assert_eq!(row.state, effect::State::Reserved);
    let now = Arc::new(idem::ManualClock::new(row.created_ms + 1));
    let opts = effect::Options::new().lease_ms(LEASE).clock(now.clone());
    let run = |conn: &mut Connection| {
        effect::run(conn, KEY, &opts, || {
            execute(&log).map_err(effect::Error::ambiguous)?;
            Ok(b"second".to_vec())
        })
    };
    let err = run(&mut conn)
        .err()
        .ok_or("ran during the dead holder's lease")?;
    assert!(matches!(err, Error::EffectInProgress { .. }), "{err:?}");
    now.set(row.lease_until_ms); // the lease lapses
    for _ in 0..2 {
        let err = run(&mut conn).err().ok_or("re-ran after the lease")?;
        assert!(matches!(err, Error::EffectAmbiguous { .. }), "{err:?}");
    }
    assert_eq!(
        effect::get(&conn, KEY)?.map(|r| r.state),
        Some(effect::State::Ambiguous),
        "never FAILED"
    );
    assert_eq!(executions(&log)?, 1, "never a second execution");
    Ok(())
}
