//! `idem import` from the outside (spawned binary): a user's SQLite database becomes an org's
//! first snapshot with its rows intact, the user's file is never written, and an existing
//! org, a corrupt file or a bad org id is refused with one clear line and nothing changed; a
//! database of many segments imports with its rows intact and a peak RSS far below its size.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{TestResult, assert_clean_failure, idem, restore, run};
use idem_org::replica::{OrgId, Replica, Settings};
use idem_org::rusqlite;
use sha2::{Digest, Sha256};

/// Rows the tests compare: a rowid table (with gaps from deletes), a table whose rowids are
/// implicit, and blobs.
type Rows = (Vec<(i64, String, i64, Vec<u8>)>, Vec<(i64, String)>);

/// A user's database in WAL mode with 8 KiB pages and real rows, some deleted. While the
/// returned connection is open the rows stay in the WAL file (no checkpoint).
fn user_db(path: &Path) -> TestResult<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path)?;
    conn.execute_batch(
        "PRAGMA page_size = 8192;
         PRAGMA journal_mode = WAL;
         PRAGMA wal_autocheckpoint = 0;
         CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT NOT NULL, cents INT, doc BLOB);
         CREATE TABLE notes (body TEXT);
         CREATE INDEX accounts_name ON accounts (name);",
    )?;
    let tx = conn.unchecked_transaction()?;
    for i in 0..2000i64 {
        tx.execute(
            "INSERT INTO accounts (name, cents, doc) VALUES (?1, ?2, ?3)",
            rusqlite::params![format!("user-{i}"), i * 37 - 500, vec![(i % 251) as u8; 40]],
        )?;
        tx.execute(
            "INSERT INTO notes (body) VALUES (?1)",
            [format!("note {i}")],
        )?;
    }
    tx.execute("DELETE FROM accounts WHERE id % 7 = 0", [])?;
    tx.execute("DELETE FROM notes WHERE rowid % 5 = 0", [])?;
    tx.commit()?;
    Ok(conn)
}

fn rows(path: &Path) -> TestResult<Rows> {
    let conn = rusqlite::Connection::open(path)?;
    let accounts = conn
        .prepare("SELECT id, name, cents, doc FROM accounts ORDER BY id")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<Result<_, _>>()?;
    let notes = conn
        .prepare("SELECT rowid, body FROM notes ORDER BY rowid")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    Ok((accounts, notes))
}

/// The user's database file and its WAL, hashed: the import must leave both as they were.
fn fingerprint(path: &Path) -> TestResult<Vec<String>> {
    let mut out = Vec::new();
    for suffix in ["", "-wal"] {
        let p = format!("{}{suffix}", path.display());
        let bytes = std::fs::read(&p).unwrap_or_default();
        out.push(hex::encode(Sha256::digest(&bytes)));
    }
    Ok(out)
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> TestResult<Vec<String>> {
    let mut out: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    out.sort();
    Ok(out)
}

/// Every file in `dir`: name, inode, size and modification time. Only `stat`s: opening and
/// closing a file this test process has open with SQLite would drop SQLite's POSIX locks on it.
fn listing(dir: &Path) -> TestResult<Vec<(String, u64, u64, std::time::SystemTime)>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for name in names(dir)? {
        let meta = std::fs::metadata(dir.join(&name))?;
        out.push((name, meta.ino(), meta.len(), meta.modified()?));
    }
    Ok(out)
}

fn json(out: &std::process::Output) -> TestResult<serde_json::Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn import(org: &str, from: &Path, store: &str) -> std::process::Output {
    let from = from.display().to_string();
    run(&["import", org, "--from", &from, "--store", store, "--json"])
}

#[test]
fn an_imported_database_restores_with_the_users_rows_and_its_file_unchanged() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("tenant.db");
    // The connection stays open: the rows are in the WAL, which the import must read.
    let keep = user_db(&db)?;
    assert!(Path::new(&format!("{}-shm", db.display())).exists());
    assert!(std::fs::metadata(format!("{}-wal", db.display()))?.len() > 0);
    let want = rows(&db)?;
    let before = fingerprint(&db)?;
    let store = dir.path().join("store").display().to_string();

    let names = names(dir.path())?;
    let out = json(&import("acme", &db, &store))?;
    // The application (`keep`) has the database open: read through SQLite beside it, using
    // its -wal and -shm and creating nothing.
    assert_eq!(out["read"], "sqlite");
    let mut now = self::names(dir.path())?;
    now.retain(|n| n != "store");
    assert_eq!(
        now, names,
        "the import created or removed a file beside the database"
    );
    assert_eq!(out["org"], "acme");
    assert_eq!(out["page_size"], 8192);
    assert_eq!(out["commit"], 0);
    assert_eq!(out["round"], 1);
    let bytes = out["bytes"].as_u64().unwrap();
    assert_eq!(bytes, out["pages"].as_u64().unwrap() * 8192);
    assert_eq!(fingerprint(&db)?, before, "the user's file was modified");

    let inspect = json(&run(&["inspect", "acme", "--store", &store, "--json"]))?;
    assert_eq!(inspect["applied_keys"], 0);
    assert_eq!(inspect["head"], "release");
    assert_eq!(inspect["newest_snapshot"]["seq"], out["snapshot_seq"]);
    assert_eq!(inspect["newest_snapshot"]["commit"], 0);

    let restored = dir.path().join("restored.db");
    restore("acme", &store, &restored)?;
    assert_eq!(
        rows(&restored)?,
        want,
        "the user's rows differ after import"
    );
    let conn = rusqlite::Connection::open(&restored)?;
    let n: i64 = conn.query_row("SELECT n FROM idem_org_commit", [], |r| r.get(0))?;
    assert_eq!(n, 0);
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    assert_eq!(mode, "delete");
    drop(keep);
    Ok(())
}

#[test]
fn the_org_layer_acquires_an_imported_org_and_runs_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("tenant.db");
    user_db(&db)?;
    // The file was an idem database of an earlier history, written up to round 5: the new
    // org's writers start again at round 2 (after the import's round 1), which its stale-round
    // check would refuse if the import kept the old highest round.
    {
        let conn = idem_org::rusqlite::Connection::open(&db)?;
        idem_org::idem::ensure_schema(&conn)?;
        conn.execute(
            "UPDATE idem_meta SET value = 5 WHERE name = 'max_round'",
            [],
        )?;
    }
    let store = dir.path().join("store");
    json(&import("acme", &db, &store.display().to_string()))?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let replica = Replica::open(Replica::local_store(&store)?, "", Settings::default()).await?;
        let registry =
            idem_org::Registry::builder(dir.path().join("data"), replica, "server").build()?;
        // An org whose snapshot commit differed from its file's would fail here (CommitMismatch).
        let org = registry.acquire(&OrgId::new("acme")?).await?;
        let out = org
            .once("pay-1", |tx| {
                tx.execute("UPDATE accounts SET cents = cents + 1 WHERE id = 1", [])?;
                tx.query_row("SELECT cents FROM accounts WHERE id = 1", [], |r| {
                    r.get::<_, i64>(0)
                })
                .map(|c| c.to_string().into_bytes())
            })
            .await?;
        assert_eq!(out.result, b"-499");
        registry.shutdown().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    let inspect = json(&run(&[
        "inspect",
        "acme",
        "--store",
        &store.display().to_string(),
        "--json",
    ]))?;
    assert_eq!(inspect["applied_keys"], 1);
    Ok(())
}

#[test]
fn importing_into_an_org_with_a_log_is_refused_and_changes_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("tenant.db");
    user_db(&db)?;
    let store = dir.path().join("store").display().to_string();
    json(&import("acme", &db, &store))?;
    let before = json(&run(&["inspect", "acme", "--store", &store, "--json"]))?;

    let other = dir.path().join("other.db");
    rusqlite::Connection::open(&other)?
        .execute_batch("CREATE TABLE x (y); INSERT INTO x VALUES (1);")?;
    let out = import("acme", &other, &store);
    assert_clean_failure(&out, "org acme already exists in the store");
    assert_clean_failure(&out, "nothing was changed");
    let after = json(&run(&["inspect", "acme", "--store", &store, "--json"]))?;
    assert_eq!(after["history"], before["history"]);
    Ok(())
}

#[test]
fn corrupt_empty_or_missing_files_are_refused_and_create_no_org() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store").display().to_string();

    let random = dir.path().join("random.db");
    let noise: Vec<u8> = (0..64 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&random, &noise)?;
    assert_clean_failure(
        &import("acme", &random, &store),
        "not a readable sqlite database",
    );

    // A real database cut short: its header promises pages the file no longer has.
    let good = dir.path().join("good.db");
    user_db(&good)?;
    rusqlite::Connection::open(&good)?.execute_batch("PRAGMA journal_mode = DELETE")?;
    let full = std::fs::read(&good)?;
    let truncated = dir.path().join("truncated.db");
    std::fs::write(&truncated, &full[..full.len() / 2])?;
    let before = fingerprint(&truncated)?;
    let out = import("acme", &truncated, &store);
    assert_clean_failure(&out, "truncated.db");
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("integrity check") || err.contains("malformed"),
        "{err}"
    );
    assert_eq!(fingerprint(&truncated)?, before);

    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"")?;
    assert_clean_failure(&import("acme", &empty, &store), "the file is empty");
    assert_clean_failure(
        &import("acme", &dir.path().join("missing.db"), &store),
        "missing.db",
    );

    // The file is checked before the store is opened: nothing was created.
    assert!(!dir.path().join("store").exists());
    Ok(())
}

#[test]
fn a_bad_org_id_is_refused_before_anything_is_read_or_written() -> TestResult {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("tenant.db");
    user_db(&db)?;
    let store = dir.path().join("store");
    for bad in ["../escape", "a/b", ""] {
        let out = import(bad, &db, &store.display().to_string());
        assert_clean_failure(&out, "org id");
    }
    assert!(!store.exists(), "a refused import created the store");
    assert!(!dir.path().join("escape").exists());
    Ok(())
}

/// sha256 over every row of `blobs` and `notes` (rowids included), in rowid order: equal
/// digests mean equal table contents, without holding the rows.
fn digest_rows(path: &Path) -> TestResult<(String, i64)> {
    let conn = rusqlite::Connection::open(path)?;
    let mut sha = Sha256::new();
    let mut n = 0i64;
    for sql in [
        "SELECT id, b FROM blobs ORDER BY id",
        "SELECT rowid, CAST(body AS BLOB) FROM notes ORDER BY rowid",
    ] {
        let mut stmt = conn.prepare(sql)?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            sha.update(row.get::<_, i64>(0)?.to_le_bytes());
            let b: Vec<u8> = row.get(1)?;
            sha.update((b.len() as u64).to_le_bytes());
            sha.update(&b);
            n += 1;
        }
    }
    Ok((hex::encode(sha.finalize()), n))
}

#[test]
fn a_database_of_many_segments_imports_streamed_in_bounded_memory() -> TestResult {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("big.db");
    // ~96 MiB of incompressible rows: about 96 segments of the default 1 MiB. `notes` has
    // implicit rowids with gaps, which a page-by-page copy keeps.
    rusqlite::Connection::open(&db)?.execute_batch(
        "CREATE TABLE blobs (id INTEGER PRIMARY KEY, b BLOB);
         CREATE TABLE notes (body TEXT);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 24000)
         INSERT INTO blobs SELECT i, randomblob(4000) FROM n;
         INSERT INTO notes SELECT 'note ' || id FROM blobs WHERE id % 3 = 0;
         DELETE FROM notes WHERE rowid % 7 = 0;",
    )?;
    let size = std::fs::metadata(&db)?.len();
    assert!(size > 90 * MIB, "{size}");
    let want = digest_rows(&db)?;
    let store = dir.path().join("store").display().to_string();

    let out = json(&import("acme", &db, &store))?;
    // The largest RSS of any child this test process waited for so far: this import, or a
    // smaller one of a test running beside it (which only makes the bound stricter).
    let peak = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)?
        .max_rss() as u64
        * 1024;
    assert!(
        peak < size / 2,
        "idem import of {} MiB peaked at {} MiB of RSS: memory must not grow with the database",
        size / MIB,
        peak / MIB
    );
    let bytes = out["bytes"].as_u64().unwrap();
    assert!(bytes >= size, "{bytes} < {size}");
    assert!(out["compressed_bytes"].as_u64().unwrap() > 64 * MIB);

    let restored = dir.path().join("restored.db");
    restore("acme", &store, &restored)?;
    assert_eq!(
        digest_rows(&restored)?,
        want,
        "the rows differ after import"
    );
    Ok(())
}

/// Regression (issue 25): any SQLite reader of a WAL database, read-only ones included,
/// creates `-wal` and `-shm` beside it when they are missing and leaves them behind. A WAL
/// database that no process has open is copied as files instead: its directory is left as it
/// was (names, sizes, times, bytes), whether it has a `-wal` of a crashed application, a stale
/// `-shm` too, or nothing beside it.
#[test]
fn a_wal_database_no_process_has_open_imports_and_leaves_its_directory_as_it_was() -> TestResult {
    let dir = tempfile::tempdir()?;
    let live = dir.path().join("live");
    std::fs::create_dir(&live)?;
    let app = user_db(&live.join("tenant.db"))?;
    let want = rows(&live.join("tenant.db"))?;
    let store = dir.path().join("store").display().to_string();
    // What a crash of `app` leaves: the files as they are while it has them open (its rows
    // are in the -wal only), with or without the -shm.
    let cases: [(&str, &[&str]); 3] = [
        ("wal", &["", "-wal"]),
        ("wal-stale-shm", &["", "-wal", "-shm"]),
        ("closed", &[]),
    ];
    for (i, (case, suffixes)) in cases.iter().enumerate() {
        let src = dir.path().join(case);
        std::fs::create_dir(&src)?;
        let db = src.join("tenant.db");
        if suffixes.is_empty() {
            // Closed by its application: checkpointed, no -wal or -shm, still WAL mode.
            drop(user_db(&db)?);
        } else {
            for suffix in *suffixes {
                std::fs::copy(
                    format!("{}{suffix}", live.join("tenant.db").display()),
                    format!("{}{suffix}", db.display()),
                )?;
            }
        }
        let before = listing(&src)?;
        let org = format!("acme{i}");
        let out = json(&import(&org, &db, &store))?;
        assert_eq!(listing(&src)?, before, "{case}: the directory changed");
        assert_eq!(out["read"], "files", "{case}");

        let restored = dir.path().join(format!("{case}.db"));
        restore(&org, &store, &restored)?;
        assert_eq!(
            rows(&restored)?,
            want,
            "{case}: the rows differ after import"
        );
    }
    drop(app);
    Ok(())
}

/// An application holding SQLite's exclusive lock (exclusive locking mode, or a long
/// rollback-journal write) excludes every reader: the import waits for it only until its
/// `--timeout`, then fails with one line naming the limit and the lock, leaving no temp file
/// and no org.
#[test]
fn a_database_another_process_locks_exclusively_times_out_and_leaves_no_temp_files() -> TestResult {
    let dir = tempfile::tempdir()?;
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp)?;
    let store = dir.path().join("store");
    for (case, setup) in [
        (
            "rollback",
            "PRAGMA journal_mode = DELETE; CREATE TABLE t (x); BEGIN EXCLUSIVE; INSERT INTO t VALUES (1);",
        ),
        (
            "wal-exclusive",
            "PRAGMA locking_mode = EXCLUSIVE; PRAGMA journal_mode = WAL; CREATE TABLE t (x); INSERT INTO t VALUES (1);",
        ),
    ] {
        let src = dir.path().join(case);
        std::fs::create_dir(&src)?;
        let db = src.join("tenant.db");
        // This test process is the application holding the lock; the import is another.
        let app = rusqlite::Connection::open(&db)?;
        app.execute_batch(setup)?;
        let before = listing(&src)?;
        let out = idem()
            .env("TMPDIR", &tmp)
            .args(["import", "acme", "--from"])
            .arg(&db)
            .arg("--store")
            .arg(&store)
            .args(["--timeout", "300ms"])
            .output()?;
        assert_clean_failure(
            &out,
            "could not copy one committed state within --timeout 300ms",
        );
        assert_clean_failure(&out, "exclusive locking mode");
        assert_clean_failure(&out, "nothing was imported");
        assert_eq!(
            names(&tmp)?,
            Vec::<String>::new(),
            "{case}: a temp file was left"
        );
        assert_eq!(listing(&src)?, before, "{case}: the directory changed");
        drop(app);
    }
    assert!(!store.exists(), "a refused import created the store");
    Ok(())
}

/// A running application whose -wal was deleted from under it: reading would make SQLite
/// create an empty log beside the database, so the import refuses and creates nothing.
#[test]
fn a_live_database_whose_wal_was_deleted_is_refused_and_nothing_is_created() -> TestResult {
    let dir = tempfile::tempdir()?;
    let src = dir.path().join("src");
    std::fs::create_dir(&src)?;
    let db = src.join("tenant.db");
    let app = user_db(&db)?;
    std::fs::remove_file(src.join("tenant.db-wal"))?;
    let before = listing(&src)?;
    let store = dir.path().join("store").display().to_string();
    let out = import("acme", &db, &store);
    assert_clean_failure(&out, "tenant.db-wal is missing");
    assert_eq!(listing(&src)?, before);
    drop(app);
    Ok(())
}

/// SQLite names the `-wal` and `-shm` after the file a symbolic link points to. An import
/// through a link must look for them there too: beside the link it would find no log and
/// miss every row still in the target's `-wal`.
#[test]
fn a_database_reached_through_a_link_is_read_with_its_targets_wal() -> TestResult {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir(dir.path().join("real"))?;
    std::fs::create_dir(dir.path().join("links"))?;
    let db = dir.path().join("real/tenant.db");
    let app = user_db(&db)?;
    let want = rows(&db)?;
    let link = dir.path().join("links/tenant.db");
    std::os::unix::fs::symlink(&db, &link)?;
    let store = dir.path().join("store").display().to_string();
    let out = json(&import("acme", &link, &store))?;
    assert_eq!(out["read"], "sqlite");
    assert_eq!(names(&dir.path().join("links"))?, ["tenant.db"]);
    let restored = dir.path().join("restored.db");
    restore("acme", &store, &restored)?;
    assert_eq!(
        rows(&restored)?,
        want,
        "rows in the target's -wal were missed"
    );
    drop(app);
    Ok(())
}
