//! The `idem-bench` binary's command line: `--help` works, and an `idem` command run through
//! it (`idem-bench idem …`, how P8 starts its children) is the `idem` command line itself, so
//! a child that cannot start fails its row with one clear line instead of a usage error.

use std::process::Command;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The binary under test.
fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_idem-bench"))
}

#[test]
fn bench_has_help() -> TestResult {
    let out = bench().arg("--help").output()?;
    assert!(out.status.success(), "--help");
    assert!(String::from_utf8_lossy(&out.stdout).contains("--quick"));
    Ok(())
}

/// Regression: the help said 1024 KiB while the replica's default segment was 256 KiB.
#[test]
fn help_names_the_replicas_default_segment_size() -> TestResult {
    let out = bench().arg("--help").output()?;
    let help = String::from_utf8(out.stdout)?;
    let kib = idem_org::replica::Settings::default().segment_bytes >> 10;
    let line = help
        .lines()
        .find(|l| l.contains("--segment-kib"))
        .ok_or("no --segment-kib in --help")?;
    assert!(
        help.contains(&format!("the replica's default, {kib} KiB")),
        "{line}: {help}"
    );
    Ok(())
}

#[test]
fn an_idem_command_runs_through_the_bench_binary() -> TestResult {
    let out = bench().args(["idem", "restore", "--help"]).output()?;
    assert!(out.status.success(), "idem restore --help");
    assert!(String::from_utf8_lossy(&out.stdout).contains("--to"));
    let dir = tempfile::tempdir()?;
    let out = bench()
        .args(["idem", "verify", "acme", "--store"])
        .arg(dir.path().join("missing"))
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "verify of a missing store: {err}");
    assert!(err.starts_with("idem: "), "one idem line: {err:?}");
    assert!(!err.contains("panicked"), "panic: {err}");
    Ok(())
}

#[test]
fn an_unknown_child_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let p = dir.path().to_str().ok_or("path")?;
    let out = bench()
        .args(["--child", "nope", "--store", p, "--org", "o", "--dir", p])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("unknown --child nope"), "{err:?}");
    Ok(())
}
