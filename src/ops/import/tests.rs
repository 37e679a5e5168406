//! The copy's own guarantees, driven through its seam and an injected clock: one pass keeps
//! its snapshot while another connection commits after every step, a pass past its deadline
//! stops with a typed timeout, and a copy of files that changed meanwhile is taken again.

use std::cell::Cell;
use std::path::Path;
use std::time::Duration;

use idem_org::rusqlite::Connection;

use super::copy::{copy, copy_sqlite};
use super::deadline::{Clock, Deadline, Monotonic};
use super::error::{ImportError, Kind, Waited};
use super::source::Plan;

type R = Result<(), Box<dyn std::error::Error>>;

/// A clock that moves `tick` at every look and never waits on the wall clock.
struct Ticks {
    now: Cell<Duration>,
    tick: Duration,
}

impl Clock for Ticks {
    fn now(&self) -> Duration {
        let t = self.now.get() + self.tick;
        self.now.set(t);
        t
    }
    fn sleep(&self, d: Duration) {
        self.now.set(self.now.get() + d);
    }
}

/// A WAL database of about 10k pages (ten backup steps) with a one-row counter.
fn tenant(path: &Path) -> Result<Connection, Box<dyn std::error::Error>> {
    let conn = Connection::open(path)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE meta (n INTEGER NOT NULL);
         INSERT INTO meta VALUES (0);
         CREATE TABLE filler (id INTEGER PRIMARY KEY, b BLOB);
         WITH RECURSIVE i(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM i WHERE x < 10000)
         INSERT INTO filler SELECT x, randomblob(3500) FROM i;",
    )?;
    Ok(conn)
}

fn counter(path: &Path) -> Result<i64, Box<dyn std::error::Error>> {
    Ok(Connection::open(path)?.query_row("SELECT n FROM meta", [], |r| r.get(0))?)
}

/// Regression (issue 25): a stepwise backup outside a transaction restarted from its first
/// page whenever another connection committed between two steps, so a tenant committing
/// faster than a pass kept it from ever ending. Here a commit lands after every step; without
/// the read transaction held across steps the pass restarts (`Restarted`).
#[test]
fn one_pass_keeps_its_snapshot_while_another_connection_commits_after_every_step() -> R {
    let dir = tempfile::tempdir()?;
    let src = dir.path().join("tenant.db");
    let app = tenant(&src)?;
    let to = dir.path().join("copy.db");
    let clock = Monotonic::start();
    let mut steps = 0u32;
    let mut commit = || {
        steps += 1;
        app.execute("UPDATE meta SET n = n + 1", [])
            .expect("the application's commit");
    };
    copy_sqlite(
        &src,
        &to,
        &Deadline::new(&clock, Duration::from_secs(600)),
        &mut commit,
    )?;
    assert!(
        steps >= 9,
        "{steps} steps: the database is too small to test steps"
    );
    assert_eq!(
        counter(&to)?,
        0,
        "the copy is not the state its pass started from"
    );
    assert_eq!(counter(&src)?, i64::from(steps));
    Ok(())
}

#[test]
fn a_pass_past_its_deadline_stops_with_the_pages_it_copied() -> R {
    let dir = tempfile::tempdir()?;
    let src = dir.path().join("tenant.db");
    drop(tenant(&src)?);
    // The WAL was checkpointed away on close, so no -wal: a rollback-mode reader's plan.
    Connection::open(&src)?.execute_batch("PRAGMA journal_mode = DELETE")?;
    let clock = Ticks {
        now: Cell::new(Duration::ZERO),
        tick: Duration::from_secs(1),
    };
    let got = copy(
        &src,
        &dir.path().join("copy.db"),
        &Deadline::new(&clock, Duration::from_secs(6)),
        &mut || {},
    );
    let e = match got {
        Err(e) => e,
        Ok(c) => return Err(format!("copied within the deadline: {c:?}").into()),
    };
    let text = e.to_string();
    let ImportError::Timeout {
        why: Waited::Copying { copied, pages },
        ..
    } = &e
    else {
        return Err(format!("not a timeout of the pass: {text}").into());
    };
    assert!(*copied >= 1024 && copied < pages, "{copied} of {pages}");
    assert!(
        text.contains(&format!(
            "within --timeout 6s (copied {copied} of {pages} pages"
        )),
        "{text}"
    );
    assert_eq!(e.kind(), Kind::Retry);
    Ok(())
}

/// An application that opens the database while its files are being copied may checkpoint
/// into the file being read; the copy must not count.
#[test]
fn a_copy_of_files_that_changed_meanwhile_is_taken_again() -> R {
    let dir = tempfile::tempdir()?;
    // A WAL database left by a crash: the database and its -wal, no -shm.
    let live = dir.path().join("live.db");
    let app = tenant(&live)?;
    app.execute_batch("PRAGMA wal_autocheckpoint = 0; UPDATE meta SET n = 7;")?;
    let src = dir.path().join("tenant.db");
    std::fs::copy(&live, &src)?;
    std::fs::copy(
        dir.path().join("live.db-wal"),
        dir.path().join("tenant.db-wal"),
    )?;
    drop(app);
    assert!(!dir.path().join("tenant.db-shm").exists());

    let to = dir.path().join("copy.db");
    let clock = Monotonic::start();
    let mut copies = 0;
    let mut app_starts = || {
        copies += 1;
        if copies == 1 {
            let conn = Connection::open(&src).expect("the application opens");
            conn.execute("UPDATE meta SET n = 8", [])
                .expect("the application writes");
        }
    };
    let got = copy(
        &src,
        &to,
        &Deadline::new(&clock, Duration::from_secs(600)),
        &mut app_starts,
    )?;
    assert_eq!(got.plan, Plan::Files);
    assert_eq!(copies, 2, "the changed copy was kept");
    assert_eq!(counter(&to)?, 8);
    Ok(())
}
