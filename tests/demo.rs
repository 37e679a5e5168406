//! The demo itself, with small sizes: replica processes, a SIGTERM handoff, a SIGKILL
//! takeover, and the exactly-once audit of the store must pass.

mod common;

use common::TestResult;

#[test]
fn demo_passes_its_exactly_once_audit() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = common::idem()
        .args([
            "demo",
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
    assert_eq!(summary["handoffs"].as_array().map(Vec::len), Some(2));
    // Every org ends at round 3 or more: A, then B, then C each claimed it.
    for (_, round) in summary["final_rounds"].as_object().ok_or("no rounds")? {
        assert!(round.as_u64().unwrap_or(0) >= 3, "{summary}");
    }
    Ok(())
}
