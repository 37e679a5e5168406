//! Operator commands from the outside (spawned binary): success paths and bad inputs
//! (unknown org, malformed URL, bad duration, corrupt snapshot) end in one clear line on
//! stderr and a non-zero exit, never a panic.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{TestResult, assert_clean_failure, run};
use idem_org::replica::{OrgId, Replica, Settings};
use idem_org::rusqlite;

/// A store holding org `acme` with three applied keys, released (no live lease).
fn seeded_store(dir: &Path) -> TestResult<String> {
    let store = dir.join("store");
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let replica = Replica::open(Replica::local_store(&store)?, "", Settings::default()).await?;
        let registry = idem_org::Registry::builder(dir.join("data"), replica, "seed")
            .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS t (k TEXT)"))
            .build()?;
        let org = registry.acquire(&OrgId::new("acme")?).await?;
        for k in ["k1", "k2", "k3"] {
            org.once(k, move |tx| {
                tx.execute("INSERT INTO t VALUES (?1)", [k])?;
                Ok::<_, rusqlite::Error>(k.as_bytes().to_vec())
            })
            .await?;
        }
        registry.shutdown().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    Ok(store.display().to_string())
}

fn stdout_json(out: &std::process::Output) -> TestResult<serde_json::Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[test]
fn every_subcommand_has_help() {
    for sub in [
        "serve",
        "prune",
        "inspect",
        "snapshots",
        "restore",
        "verify",
        "check-store",
        "import",
        "clone",
    ] {
        let out = run(&[sub, "--help"]);
        assert!(out.status.success(), "{sub} --help");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage"),
            "{sub}"
        );
    }
}

#[test]
fn inspect_snapshots_restore_verify_succeed_on_a_good_store() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let v = stdout_json(&run(&["inspect", "acme", "--store", &store, "--json"]))?;
    assert_eq!(v["applied_keys"], 3);
    assert_eq!(v["head"], "release");
    // The org lease stays after a release; the release is what ends it.
    assert_eq!(v["lease"]["released"], true, "{v}");
    let snaps = stdout_json(&run(&["snapshots", "acme", "--store", &store, "--json"]))?;
    let snaps = snaps.as_array().ok_or("not an array")?;
    assert!(!snaps.is_empty());
    let first_seq = snaps[0]["seq"].as_u64().ok_or("no seq")?.to_string();
    assert_eq!(snaps[0]["kind"], "snapshot");
    assert!(snaps[1..].iter().all(|s| s["kind"] == "delta"), "{snaps:?}");
    // Point-in-time restore: every position holds exactly the rows of its commit.
    for s in snaps {
        let seq = s["seq"].as_u64().ok_or("no seq")?;
        let dest = dir.path().join(format!("at-{seq}.db"));
        let out = run(&[
            "restore",
            "acme",
            "--store",
            &store,
            "--at",
            &seq.to_string(),
            "--to",
            dest.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let conn = rusqlite::Connection::open(&dest)?;
        let n: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
        assert_eq!(Some(n as u64), s["commit"].as_u64(), "restore --at {seq}");
    }

    let dest = dir.path().join("acme.db");
    let out = run(&[
        "restore",
        "acme",
        "--store",
        &store,
        "--to",
        dest.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not a terminal (cron, a pipe): no progress bar, nothing on stderr.
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let conn = rusqlite::Connection::open(&dest)?;
    let n: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
    assert_eq!(n, 3);
    let older = dir.path().join("older.db");
    let out = run(&[
        "restore",
        "acme",
        "--store",
        &store,
        "--at",
        &first_seq,
        "--to",
        older.to_str().unwrap(),
    ]);
    assert!(out.status.success());

    let v = stdout_json(&run(&["verify", "--store", &store, "--json"]))?;
    assert_eq!(v["faults"], 0);
    assert_eq!(v["ok"].as_u64(), Some(snaps.len() as u64));
    let plain = run(&["verify", "--store", &store]);
    assert!(plain.status.success());
    assert!(
        plain.stderr.is_empty(),
        "no progress bar outside a terminal: {}",
        String::from_utf8_lossy(&plain.stderr)
    );
    Ok(())
}

#[test]
fn bad_inputs_fail_with_one_clear_line() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    assert_clean_failure(&run(&["inspect", "nobody", "--store", &store]), "not found");
    assert_clean_failure(
        &run(&["snapshots", "a/../b", "--store", &store]),
        "invalid org id",
    );
    assert_clean_failure(&run(&["verify", "nobody", "--store", &store]), "not found");
    assert_clean_failure(
        &run(&["inspect", "acme", "--store", "ftp://host/x"]),
        "store URL \"ftp://host/x\": unsupported scheme",
    );
    assert_clean_failure(&run(&["inspect", "acme", "--store", "s3://"]), "store");
    assert_clean_failure(
        &run(&["prune", "--store", &store, "--older-than", "7 fortnights"]),
        "older-than",
    );
    let dest = dir.path().join("x.db");
    assert_clean_failure(
        &run(&[
            "restore",
            "acme",
            "--store",
            &store,
            "--at",
            "999999",
            "--to",
            dest.to_str().unwrap(),
        ]),
        "no published snapshot or delta at seq",
    );
    assert_clean_failure(&run(&["check-store", "gs://"]), "store");
    Ok(())
}

#[test]
fn corrupt_snapshot_is_reported_and_never_restored() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let snap_dir = Path::new(&store).join("orgs/acme/snap");
    let mut blobs: Vec<_> = std::fs::read_dir(&snap_dir)?
        .flatten()
        .map(|e| e.path())
        .collect();
    blobs.sort();
    let newest = blobs.last().ok_or("no blob")?;
    let mut bytes = std::fs::read(newest)?;
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xFF;
    std::fs::write(newest, bytes)?;

    let out = run(&["verify", "--store", &store]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("seq ") && err.contains("corrupt"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let dest = dir.path().join("x.db");
    assert_clean_failure(
        &run(&[
            "restore",
            "acme",
            "--store",
            &store,
            "--to",
            dest.to_str().unwrap(),
        ]),
        "acme",
    );
    assert!(!dest.exists(), "a corrupt snapshot is never installed");
    Ok(())
}

#[test]
fn prune_respects_a_live_lease_unless_forced() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let out = run(&["prune", "--store", &store, "--older-than", "0s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("in 1 of 1 orgs; 0 skipped (held by a live writer); 0 failed")
    );

    // A live writer (claimed, lease 30 s, never released) holds acme.
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let replica = Replica::open(
            Replica::local_store(Path::new(&store))?,
            "",
            Settings::default(),
        )
        .await?;
        let org = OrgId::new("acme")?;
        replica.claim(&org, "live-writer", false).await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    // Skipped, counted apart, and not a failure: a cron job beside a server stays green.
    let out = run(&["prune", "--store", &store, "--older-than", "7d"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("in 0 of 1 orgs; 1 skipped (held by a live writer); 0 failed"),
        "{said}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("held by live writer live-writer"));
    let out = run(&[
        "prune",
        "--store",
        &store,
        "--older-than",
        "7d",
        "--org",
        "nosuch",
    ]);
    assert_clean_failure(&out, "does not exist");
    let out = run(&[
        "prune",
        "--store",
        &store,
        "--older-than",
        "7d",
        "--force",
        "--json",
    ]);
    let v = stdout_json(&out)?;
    assert_eq!(v["failed"], 0);
    Ok(())
}

#[test]
fn check_store_round_trips_on_a_local_directory() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = run(&[
        "check-store",
        dir.path().join("s").to_str().unwrap(),
        "--json",
    ]);
    let v = stdout_json(&out)?;
    assert_eq!(v["ok"], true);
    let url = format!("file://{}", dir.path().join("s2").display());
    assert!(run(&["check-store", &url]).status.success());
    // It leaves nothing behind, not even empty folders.
    for s in ["s", "s2"] {
        let left: Vec<_> = std::fs::read_dir(dir.path().join(s))?.collect();
        assert!(left.is_empty(), "{s}: {left:?}");
    }
    Ok(())
}

/// Regression: check-store's scratch org left empty folders under `orgs/` in a local store
/// (deletes keep folders), and a later cron `prune` counted them as orgs and exited 1.
#[test]
fn check_store_leaves_no_org_behind_and_prune_stays_green() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    assert!(run(&["check-store", &store]).status.success());
    let data = dir.path().join("prune-data");
    let out = run(&[
        "prune",
        "--store",
        &store,
        "--older-than",
        "7d",
        "--data",
        data.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["verify", "--store", &store, "--json"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("idem-check"), "{text}");
    Ok(())
}

/// Every entry under `dir` with its modification time: a create or delete anywhere changes a
/// directory's time, so two equal listings mean nothing was written.
fn tree(dir: &Path) -> TestResult<Vec<(String, std::time::SystemTime)>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        out.push((d.display().to_string(), std::fs::metadata(&d)?.modified()?));
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push((p.display().to_string(), std::fs::metadata(&p)?.modified()?));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Regression: every read-only command ran the create-only probe (a write), so it failed
/// with an auditor's read-only credentials; a mistyped local store path was created and
/// verified as an empty store ("verified 0 orgs", exit 0); `restore --to` created a missing
/// parent directory.
#[test]
fn read_only_commands_write_nothing_and_refuse_a_missing_store() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let before = tree(Path::new(&store))?;
    let to = dir.path().join("copy.db");
    for args in [
        vec!["inspect", "acme", "--store", &store],
        vec!["snapshots", "acme", "--store", &store],
        vec!["verify", "--store", &store],
        vec!["effects", "acme", "--store", &store],
        vec![
            "restore",
            "acme",
            "--store",
            &store,
            "--to",
            to.to_str().ok_or("path")?,
        ],
    ] {
        let out = run(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        tree(Path::new(&store))?,
        before,
        "a read-only command wrote to the store"
    );

    let missing = dir.path().join("no-such-store");
    let m = missing.to_str().ok_or("path")?;
    for args in [
        vec!["verify", "--store", m],
        vec!["inspect", "acme", "--store", m],
    ] {
        assert_clean_failure(&run(&args), "no store at");
    }
    assert!(
        !missing.exists(),
        "a read-only command created the store directory"
    );
    let nowhere = dir.path().join("missing-dir").join("x.db");
    let out = run(&[
        "restore",
        "acme",
        "--store",
        &store,
        "--to",
        nowhere.to_str().ok_or("path")?,
    ]);
    assert_clean_failure(&out, "does not exist");
    assert!(!dir.path().join("missing-dir").exists());
    Ok(())
}

/// Regression: logs carried colour codes into files and pipes.
#[test]
fn logs_carry_no_colour_codes() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let out = common::idem()
        .args(["inspect", "acme", "--store", &store])
        .env("IDEM_LOG", "debug")
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(" INFO idem_replica"),
        "IDEM_LOG=debug shows the log lines: {err}"
    );
    assert!(!err.contains('\u{1b}'), "colour codes in a pipe: {err:?}");
    Ok(())
}

/// Regression: `s3://` with no credentials in the environment failed with a request to the
/// cloud metadata address; the error now names the variables to set.
#[test]
fn s3_without_credentials_names_the_variables_to_set() -> TestResult {
    let mut cmd = common::idem();
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            cmd.env_remove(k);
        }
    }
    // Nothing listens there: the metadata lookup fails at once instead of timing out.
    let out = cmd
        .args(["check-store", "s3://bucket/prefix"])
        .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9")
        .env("AWS_METADATA_ENDPOINT", "http://127.0.0.1:9")
        .env("AWS_ENDPOINT", "http://127.0.0.1:9")
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_REGION", "us-east-1")
        .output()?;
    assert_clean_failure(&out, "AWS_ACCESS_KEY_ID");
    Ok(())
}

/// Regression: the `snapshots` table's columns did not line up with its header (JSON values
/// ignore widths, and writer ids are longer than the fixed column).
#[test]
fn the_snapshots_table_lines_up() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let out = run(&["snapshots", "acme", "--store", &store]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout)?;
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 3, "{text}");
    // Each header word ends where its column's cells end (numbers right-aligned) or starts
    // where they start (text left-aligned).
    let header = lines[0];
    let end_of = |word: &str| header.find(word).map(|i| i + word.len());
    let commit_end = end_of("commit").ok_or("no commit column")?;
    let writer_at = header.find("writer").ok_or("no writer column")?;
    // The table ends at the blank line before the window line.
    for row in lines[1..].iter().take_while(|l| !l.is_empty()) {
        assert_eq!(row.len(), commit_end, "row {row:?} vs header {header:?}");
        assert!(
            row[writer_at..].starts_with("seed"),
            "row {row:?} vs header {header:?}"
        );
    }
    Ok(())
}

/// `serve --help` shows the lease, drain and force-claim flags an operator needs.
#[test]
fn serve_help_shows_the_operator_flags() {
    let out = run(&["serve", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--lease-ms", "--force-claim", "--drain-timeout", "--writer"] {
        assert!(help.contains(flag), "{flag} missing from serve --help");
    }
    // It says it is unauthenticated, and listens on loopback unless told otherwise.
    assert!(help.contains("unauthenticated"), "{help}");
    assert!(help.contains("[default: 127.0.0.1:8080]"), "{help}");
}

/// `serve --lease-ms` below a second is refused before anything starts, naming the minimum.
#[test]
fn serve_refuses_a_lease_shorter_than_a_second() {
    let out = run(&[
        "serve",
        "--store",
        "/nonexistent",
        "--data",
        "/nonexistent",
        "--lease-ms",
        "999",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--lease-ms") && err.contains("1000 ms"),
        "{err}"
    );
}
