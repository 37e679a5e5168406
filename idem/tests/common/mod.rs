//! Helpers shared by the idem integration tests (included with `mod common;`).
#![allow(dead_code)]

use std::sync::mpsc;

use idem::failpoint::{FailPoint, Failpoints};
use rusqlite::Connection;

pub type BoxErr = Box<dyn std::error::Error + Send + Sync>;
pub type R = Result<(), BoxErr>;

pub fn db() -> Result<(tempfile::TempDir, std::path::PathBuf, Connection), BoxErr> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("t.db");
    let conn = Connection::open(&path)?;
    conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE effects (key TEXT NOT NULL)")?;
    idem::ensure_schema(&conn)?;
    Ok((dir, path, conn))
}

pub fn effects(conn: &Connection, key: &str) -> rusqlite::Result<i64> {
    conn.query_row("SELECT count(*) FROM effects WHERE key = ?1", [key], |r| {
        r.get(0)
    })
}

/// Opens a second connection whose busy handler reports, once, that it is waiting for the
/// write lock: the seam that orders "B is blocked behind A" without a sleep.
pub fn blocked_signal_conn(
    path: &std::path::Path,
) -> Result<(Connection, mpsc::Receiver<()>), BoxErr> {
    let mut conn = Connection::open(path)?;
    let (tx, rx) = mpsc::channel();
    conn.busy_handler(Some(move |count: i32| {
        if count == 0 {
            let _ = tx.send(());
        }
        // Back off briefly between retries of the lock; ordering comes from the signal.
        std::thread::sleep(std::time::Duration::from_millis(1));
        true
    }))?;
    Ok((conn, rx))
}

/// Failpoints made of a closure.
pub struct FnFailpoints<F>(pub F);

impl<F> std::fmt::Debug for FnFailpoints<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnFailpoints")
    }
}

impl<F: Fn(FailPoint) -> Result<(), String> + Send + Sync> Failpoints for FnFailpoints<F> {
    fn hit(&self, point: FailPoint) -> Result<(), String> {
        (self.0)(point)
    }
}
