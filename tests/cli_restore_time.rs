//! `idem restore --at-time` and the window `idem snapshots` prints, on the real binary: a
//! moment restores the newest position published at or before it (the same file `--at SEQ`
//! gives), a moment before every kept position fails naming the oldest, bad input fails with
//! one clear line.

mod common;

use std::path::Path;

use common::{TestResult, assert_clean_failure, run};
use idem_org::replica::{OrgId, Replica, Settings};

/// A store with org `acme`: three acknowledged requests, released.
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
                Ok::<_, idem_org::rusqlite::Error>(k.as_bytes().to_vec())
            })
            .await?;
        }
        registry.shutdown().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    Ok(store.display().to_string())
}

fn positions(store: &str) -> TestResult<Vec<serde_json::Value>> {
    let out = run(&["snapshots", "acme", "--store", store, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v.as_array().ok_or("not an array")?.clone())
}

fn restore(store: &str, to: &Path, how: &[&str]) -> std::process::Output {
    let to = to.display().to_string();
    let mut args = vec!["restore", "acme", "--store", store, "--to", to.as_str()];
    args.extend_from_slice(how);
    run(&args)
}

#[test]
fn a_moment_restores_what_its_position_restores() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let all = positions(&store)?;
    assert!(all.len() >= 2, "{all:?}");
    // Every position by its own moment: the same file as by its seq (the newest position of
    // that moment, which is that one unless two share a millisecond).
    for p in &all {
        let (seq, at) = (p["seq"].to_string(), p["at"].as_str().ok_or("no at")?);
        let newest_at_moment = all
            .iter()
            .filter(|q| q["at"] == p["at"])
            .filter_map(|q| q["seq"].as_u64())
            .max()
            .ok_or("no seq")?;
        let (by_time, by_seq) = (
            dir.path().join(format!("t{seq}.db")),
            dir.path().join(format!("s{seq}.db")),
        );
        let out = restore(&store, &by_time, &["--at-time", at]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.contains(&format!("at seq {newest_at_moment} ")),
            "{said}"
        );
        let out = restore(&store, &by_seq, &["--at", &newest_at_moment.to_string()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(std::fs::read(&by_time)?, std::fs::read(&by_seq)?, "at {at}");
    }
    Ok(())
}

#[test]
fn a_moment_before_the_window_and_bad_moments_fail_with_one_clear_line() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let oldest = positions(&store)?
        .first()
        .and_then(|p| p["seq"].as_u64())
        .ok_or("no position")?;
    let to = dir.path().join("x.db");
    let out = restore(&store, &to, &["--at-time", "2001-01-01T00:00:00Z"]);
    assert_clean_failure(&out, &format!("the oldest kept is seq {oldest}"));
    assert_clean_failure(
        &restore(&store, &to, &["--at-time", "yesterday"]),
        "RFC 3339",
    );
    assert_clean_failure(
        &restore(
            &store,
            &to,
            &["--at", "2", "--at-time", "2030-01-01T00:00:00Z"],
        ),
        "cannot be used with",
    );
    assert!(!to.exists(), "a refused restore wrote its file");
    Ok(())
}

#[test]
fn snapshots_prints_the_window_after_the_table() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let all = positions(&store)?;
    let out = run(&["snapshots", "acme", "--store", &store]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout)?;
    let last = text.lines().last().ok_or("no output")?;
    let (first, newest) = (&all[0], &all[all.len() - 1]);
    let want = format!(
        "window: {} positions, seq {} ({}) to seq {} ({});",
        all.len(),
        first["seq"],
        first["at"].as_str().ok_or("no at")?,
        newest["seq"],
        newest["at"].as_str().ok_or("no at")?
    );
    assert!(last.starts_with(&want), "{last:?} vs {want:?}");
    Ok(())
}
