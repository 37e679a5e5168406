//! The dedup transaction's write hook (`Options::on_write`) commits with what it guards: a
//! counter the hook raises must move with every applied run and every counted failure, and
//! never on a replay, or a layer that ships by that counter would acknowledge a state it did
//! not ship (I1, I6).

use std::sync::Arc;

use idem::Options;
use idem::effect::WriteHook;
use rusqlite::Connection;

type Res = Result<(), Box<dyn std::error::Error>>;

fn counter(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT n FROM counter", [], |r| r.get(0))
}

fn setup() -> Result<(Connection, Options), Box<dyn std::error::Error>> {
    let conn = Connection::open_in_memory()?;
    conn.execute_batch("CREATE TABLE counter (n INTEGER); INSERT INTO counter VALUES (0);")?;
    let hook: WriteHook = Arc::new(|c| c.execute("UPDATE counter SET n = n + 1", []).map(|_| ()));
    Ok((conn, Options::new().on_write(hook)))
}

#[test]
fn hook_commits_with_an_applied_run_and_not_with_a_replay() -> Res {
    let (mut conn, opts) = setup()?;
    for _ in 0..3 {
        idem::once_with(&mut conn, "k", 1, &opts, |_| {
            Ok::<_, rusqlite::Error>(b"ok".to_vec())
        })?;
    }
    assert_eq!(counter(&conn)?, 1);
    Ok(())
}

#[test]
fn hook_commits_with_a_counted_failure() -> Res {
    let (mut conn, opts) = setup()?;
    let failed = idem::once_with(&mut conn, "k", 1, &opts, |_| {
        Err::<Vec<u8>, _>(std::io::Error::other("no"))
    });
    assert!(matches!(failed, Err(idem::Error::Apply { .. })));
    assert_eq!(counter(&conn)?, 1);
    Ok(())
}

#[test]
fn failing_hook_rolls_the_applied_run_back() -> Res {
    let (mut conn, _) = setup()?;
    conn.execute_batch("CREATE TABLE t (x INTEGER)")?;
    let hook: WriteHook = Arc::new(|c| c.execute_batch("SELECT * FROM no_such_table"));
    let opts = Options::new().on_write(hook);
    let out = idem::once_with(&mut conn, "k", 1, &opts, |tx| {
        tx.execute("INSERT INTO t VALUES (1)", [])?;
        Ok::<_, rusqlite::Error>(Vec::new())
    });
    assert!(matches!(out, Err(idem::Error::Sqlite(_))));
    let rows: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
    assert_eq!(rows, 0);
    assert_eq!(idem::applied(&conn, "k")?, None);
    Ok(())
}
