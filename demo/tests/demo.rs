//! The demo itself, with small sizes: replica processes, a SIGTERM handoff, a SIGKILL
//! takeover, and the exactly-once audit of the store must pass.

use std::process::Command;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The binary under test.
fn demo() -> Command {
    Command::new(env!("CARGO_BIN_EXE_idem-demo"))
}

#[test]
fn demo_passes_its_exactly_once_audit() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = demo()
        .args([
            "--orgs",
            "3",
            "--requests",
            "60",
            "--clients",
            "4",
            "--json",
            "--dir",
        ])
        .arg(dir.path())
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed: {stderr}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(summary["acknowledged"], 60);
    assert_eq!(summary["violations"], serde_json::json!([]));
    assert!(summary["ships"].as_u64().unwrap_or(0) > 0);
    let handoffs = summary["handoffs"].as_array().ok_or("no handoffs")?;
    assert_eq!(handoffs.len(), 2);
    // Each handoff reports what it made the orgs wait, apart from their request spacing.
    for h in handoffs {
        let wait = h["org_wait_p99_ms"].as_f64().ok_or("no wait")?;
        let longest_wait = h["max_org_wait_ms"].as_f64().ok_or("no max wait")?;
        assert!(0.0 < wait && wait <= longest_wait, "{h}");
    }
    // Every org ends at round 3 or more: A, then B, then C each claimed it.
    for (_, round) in summary["final_rounds"].as_object().ok_or("no rounds")? {
        assert!(round.as_u64().unwrap_or(0) >= 3, "{summary}");
    }
    Ok(())
}

/// The same with every replica on the journal: the handoffs go through a release seal and
/// an adopt seal, and the audit reads every org through the journal.
#[test]
fn demo_on_the_journal_passes_its_exactly_once_audit() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = demo()
        .args([
            "--orgs",
            "6",
            "--requests",
            "90",
            "--clients",
            "4",
            "--journal",
            "--json",
            "--dir",
        ])
        .arg(dir.path())
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed: {stderr}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(summary["acknowledged"], 90);
    assert_eq!(summary["violations"], serde_json::json!([]));
    // The acknowledgements are in the replicas' journal runs.
    let runs = std::fs::read_dir(dir.path().join("store/journals"))?.count();
    assert!(runs >= 3, "{runs} journal runs for three replicas");
    Ok(())
}

#[test]
fn demo_has_help() -> TestResult {
    let out = demo().arg("--help").output()?;
    assert!(out.status.success(), "--help");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"));
    Ok(())
}

/// Regression: `--dir` on a used directory audited the previous run's store (53 false
/// violations).
#[test]
fn demo_refuses_a_used_dir() -> TestResult {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("left-over"), b"")?;
    let out = demo().arg("--dir").arg(dir.path()).output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(!err.contains("RUST_BACKTRACE"), "backtrace hint: {err}");
    assert!(err.lines().any(|l| !l.trim().is_empty()), "no error line");
    assert!(
        err.contains("not empty"),
        "stderr {err:?} lacks \"not empty\""
    );
    Ok(())
}
