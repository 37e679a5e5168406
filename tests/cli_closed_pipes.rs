//! Every command into a closed pipe (`idem snapshots ORG | head -c 1` after `head` exits), and
//! `IDEM_LOG` parsed strictly: spawned binaries, real pipes.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{TestResult, idem, seeded_effects_store};
use idem_org::rusqlite;

/// The store of [`seeded_effects_store`] (org `acme`, one committed and two ambiguous
/// effects, released) and a user database `user.db` to import.
fn seeded(dir: &Path) -> TestResult<String> {
    let store = seeded_effects_store(dir)?;
    let user = rusqlite::Connection::open(dir.join("user.db"))?;
    user.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1), (2);")?;
    Ok(store)
}

/// Runs `cmd` with its stdout the write end of a pipe whose read end is already closed
/// (`| head -c 0`): its very first write meets EPIPE, whatever the timing.
fn into_closed_stdout(mut cmd: Command) -> TestResult<Output> {
    let (reader, writer) = std::io::pipe()?;
    drop(reader);
    Ok(cmd.stdout(writer).stderr(Stdio::piped()).output()?)
}

/// Runs `cmd` like `cmd | head -c 1`: reads one byte of its stdout, then closes the pipe.
fn into_head_c_1(mut cmd: Command) -> TestResult<Output> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let mut one = [0u8; 1];
    let _ = stdout.read(&mut one)?;
    drop(stdout);
    Ok(child.wait_with_output()?)
}

/// Every command's output into a closed pipe, text and `--json`.
fn commands(dir: &Path, store: &str) -> Vec<Vec<String>> {
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let restored = |n: &str| dir.join(n).display().to_string();
    let user = dir.join("user.db").display().to_string();
    let scratch = dir.join("scratch-store").display().to_string();
    let mut all = Vec::new();
    for json in [false, true] {
        let tag = if json { "j" } else { "t" };
        let new_org = format!("new-{tag}");
        for mut a in [
            s(&["inspect", "acme", "--store", store]),
            s(&["snapshots", "acme", "--store", store]),
            s(&["verify", "--store", store]),
            s(&["effects", "acme", "--store", store]),
            s(&["prune", "--store", store, "--older-than", "7d"]),
            s(&["check-store", &scratch]),
            s(&["import", &new_org, "--from", &user, "--store", store]),
        ] {
            if json {
                a.push("--json".into());
            }
            all.push(a);
        }
    }
    all.push(s(&[
        "restore",
        "acme",
        "--store",
        store,
        "--to",
        &restored("r.db"),
    ]));
    all.push(s(&[
        "resolve",
        "acme",
        "lost-1",
        "--not-executed",
        "--by",
        "ops",
        "--store",
        store,
    ]));
    all.push(s(&["--help"]));
    all.push(s(&["inspect", "--help"]));
    all.push(s(&["--version"]));
    all
}

fn assert_quiet_success(args: &[String], out: &Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    assert!(
        !err.contains("Broken pipe"),
        "{args:?} reported the closed pipe: {err}"
    );
}

/// Runs each of [`commands`] (`readers_only`: those that write nothing to the store) through
/// `via` against a fresh seeded store, and asserts each ends quietly with exit 0.
fn each_command_exits_quietly(
    readers_only: bool,
    via: fn(Command) -> TestResult<Output>,
) -> TestResult {
    const READERS: [&str; 6] = [
        "inspect",
        "snapshots",
        "verify",
        "effects",
        "--help",
        "--version",
    ];
    let dir = tempfile::tempdir()?;
    let store = seeded(dir.path())?;
    for args in commands(dir.path(), &store) {
        if readers_only && !READERS.contains(&args[0].as_str()) {
            continue;
        }
        let mut cmd = idem();
        cmd.args(&args);
        assert_quiet_success(&args, &via(cmd)?);
    }
    Ok(())
}

/// Regression: `idem snapshots ORG --store S | head -c 20` panicked ("failed printing to
/// stdout: Broken pipe", exit 101). A closed stdout ends every command quietly, with the
/// exit code of its work.
#[test]
fn every_command_into_a_closed_stdout_exits_quietly() -> TestResult {
    each_command_exits_quietly(false, into_closed_stdout)
}

/// The same as `| head -c 1`: one byte read, then the pipe closed while the command may still
/// be writing.
#[test]
fn every_read_command_into_head_c_1_exits_quietly() -> TestResult {
    each_command_exits_quietly(true, into_head_c_1)
}

/// A failing command whose stderr is closed (`2>&-` into a dead pipe) still exits 1, the
/// code of its failure, not 101.
#[test]
fn a_failure_into_a_closed_stderr_exits_1() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded(dir.path())?;
    let (reader, writer) = std::io::pipe()?;
    drop(reader);
    let out = idem()
        .args(["inspect", "nobody", "--store", &store])
        .stdout(Stdio::piped())
        .stderr(writer)
        .output()?;
    assert_eq!(out.status.code(), Some(1), "{:?}", out.status);
    Ok(())
}

/// Regression: `IDEM_LOG=debgu` (a target name to tracing), `[[` and `idem=notalevel` were
/// accepted silently (logging off or the default). A bad filter is refused at start with
/// one line naming it, exit 2; good ones run the command.
#[test]
fn a_bad_idem_log_is_refused_with_one_line_naming_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded(dir.path())?;
    for bad in [
        "debgu",
        "[[",
        "idem=notalevel",
        "info,idem_org=verbose",
        "idem_org[",
        "=info",
        "a b=info",
    ] {
        let out = idem()
            .env("IDEM_LOG", bad)
            .args(["inspect", "acme", "--store", &store])
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert!(out.stdout.is_empty(), "{bad:?}: the command did not run");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{bad:?}: one line, got {err:?}");
        assert!(lines[0].contains("IDEM_LOG"), "{bad:?}: {err}");
        let named = bad
            .split(',')
            .any(|d| !d.is_empty() && lines[0].contains(d));
        assert!(named, "{bad:?}: the line names the directive: {err}");
    }
    for good in [
        "",
        "warn",
        "INFO",
        "off",
        "idem_org=debug",
        "warn,idem_replica::ship=trace",
        "idem_org[ship]=debug",
        "[request{org=acme}]=trace",
        "idem_org=debug,",
    ] {
        let out = idem()
            .env("IDEM_LOG", good)
            .args(["inspect", "acme", "--store", &store, "--json"])
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{good:?}: {err}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(v["org"], "acme", "{good:?}");
    }
    // `idem serve` refuses it before it binds or touches the store.
    let out = idem()
        .env("IDEM_LOG", "debgu")
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(dir.path().join("never"))
        .arg("--data")
        .arg(dir.path().join("never-data"))
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        !dir.path().join("never").exists(),
        "the store was not touched"
    );
    assert!(out.stdout.is_empty(), "never listened");
    Ok(())
}
