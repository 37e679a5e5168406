//! `idem effects` and `idem resolve` from the outside (spawned binary).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{TestResult, assert_clean_failure, run, seeded_effects_store};

fn effects_json(store: &str, state: &str) -> TestResult<Vec<serde_json::Value>> {
    let out = run(&[
        "effects", "acme", "--store", store, "--state", state, "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["effects"].as_array().cloned().unwrap_or_default())
}

#[test]
fn effects_lists_by_state_and_resolve_records_who() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_effects_store(dir.path())?;
    let ambiguous = effects_json(&store, "ambiguous")?;
    let keys: Vec<_> = ambiguous.iter().map(|e| e["key"].clone()).collect();
    assert_eq!(keys, ["lost-1", "lost-2"]);
    assert_eq!(ambiguous[0]["error"], "connection reset");

    let out = run(&[
        "resolve",
        "acme",
        "lost-1",
        "--executed",
        "--result",
        "paid",
        "--by",
        "alice",
        "--store",
        &store,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&[
        "resolve",
        "acme",
        "lost-2",
        "--not-executed",
        "--by",
        "bob",
        "--store",
        &store,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["effect"]["state"], "failed");
    assert_eq!(v["effect"]["resolved_by"], "bob");

    assert!(effects_json(&store, "ambiguous")?.is_empty());
    let committed = effects_json(&store, "committed")?;
    let lost1 = committed
        .iter()
        .find(|e| e["key"] == "lost-1")
        .ok_or("lost-1 not committed")?;
    assert_eq!(
        (&lost1["result"], &lost1["resolved_by"]),
        (&"paid".into(), &"alice".into())
    );
    let text = run(&["effects", "acme", "--store", &store]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("3 effects in org acme"));
    Ok(())
}

#[test]
fn resolve_refuses_what_is_not_ambiguous_and_bad_input() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_effects_store(dir.path())?;
    let out = run(&[
        "resolve",
        "acme",
        "sent",
        "--not-executed",
        "--by",
        "x",
        "--store",
        &store,
    ]);
    assert_clean_failure(&out, "nothing to resolve");
    // It looked before claiming: no round was written (the live writer was not fenced), and
    // `--force` changes nothing about that.
    let claims = || -> TestResult<usize> {
        let log = Path::new(&store).join("orgs").join("acme").join("log");
        Ok(std::fs::read_dir(log)?.count())
    };
    let before = claims()?;
    for extra in [&[][..], &["--force"][..]] {
        let mut args = vec![
            "resolve",
            "acme",
            "sent",
            "--not-executed",
            "--by",
            "x",
            "--store",
            &store,
        ];
        args.extend_from_slice(extra);
        assert_clean_failure(&run(&args), "nothing to resolve");
        let out = run(&[
            "resolve",
            "acme",
            "never",
            "--not-executed",
            "--by",
            "x",
            "--store",
            &store,
        ]);
        assert_clean_failure(&out, "no effect");
    }
    assert_eq!(
        claims()?,
        before,
        "resolve claimed the org to find nothing to do"
    );
    let out = run(&["resolve", "acme", "lost-1", "--by", "x", "--store", &store]);
    assert_clean_failure(&out, "--executed");
    let out = run(&[
        "resolve",
        "acme",
        "lost-1",
        "--executed",
        "--by",
        "x",
        "--store",
        &store,
    ]);
    assert_clean_failure(&out, "--result");
    let out = run(&["effects", "acme", "--store", &store, "--state", "weird"]);
    assert_clean_failure(&out, "unknown state");
    let out = run(&["effects", "nobody", "--store", &store]);
    assert_clean_failure(&out, "not found");
    assert_eq!(
        effects_json(&store, "ambiguous")?.len(),
        2,
        "nothing changed"
    );
    Ok(())
}
