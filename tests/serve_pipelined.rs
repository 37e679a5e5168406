//! `idem serve --ship-window N` (`docs/design.md` 3e) over real HTTP: concurrent clients of one
//! org are acknowledged through pipelined ships, whose entries (format 4) a second server
//! hydrates after a SIGTERM handoff; a window outside 1..=8 is refused before the store is
//! touched.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Server, TestResult, assert_clean_failure, client, run};
use serde_json::{Value, json};

#[tokio::test]
async fn a_pipelined_server_acknowledges_every_request_and_its_successor_reads_the_entries()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let mut a = Server::start_with(
        &store,
        &dir.path().join("data-a"),
        &["--writer", "a", "--ship-window", "4"],
        &[],
    )?;
    let n = 48;
    let mut tasks = Vec::new();
    for i in 0..n {
        let url = a.url.clone();
        tasks.push(tokio::spawn(async move {
            let resp = client()
                .post(format!("{url}/orgs/acme/transfers"))
                .header("Idempotency-Key", format!("p-{i}"))
                .json(&json!({"from": "x", "to": "y", "cents": i + 1}))
                .send()
                .await?;
            Ok::<_, reqwest::Error>(resp.status().as_u16())
        }));
    }
    for t in tasks {
        assert_eq!(t.await??, 201);
    }
    let status =
        tokio::task::spawn_blocking(move || a.terminate().map_err(|e| e.to_string())).await??;
    assert!(status.success(), "A exits 0 after releasing");

    // Every entry A wrote is of its pipelined claim: format 4, window 4.
    let log = store.join("orgs/acme/log");
    let mut pipelined = 0;
    for e in std::fs::read_dir(&log)? {
        let entry: Value = serde_json::from_slice(&std::fs::read(e?.path())?)?;
        assert_eq!(entry["v"], json!(4), "{entry}");
        assert_eq!(entry["window"], json!(4), "{entry}");
        pipelined += 1;
    }
    assert!(pipelined >= 3, "claim, ships, release: {pipelined} entries");

    // A successor on an empty data directory hydrates from those entries alone.
    let b = Server::start(&store, &dir.path().join("data-b"), "b", &[])?;
    let total: i64 = (1..=n).sum();
    let bal: Value = client()
        .get(format!("{}/orgs/acme/balances", b.url))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(bal["balances"], json!({"x": -total, "y": total}));
    Ok(())
}

#[test]
fn a_ship_window_outside_one_to_eight_is_refused_before_the_store_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    for bad in ["0", "9", "four"] {
        let out = run(&[
            "serve",
            "--store",
            store.to_str().unwrap(),
            "--data",
            dir.path().join("data").to_str().unwrap(),
            "--ship-window",
            bad,
        ]);
        assert_clean_failure(&out, "--ship-window");
    }
    assert!(!store.exists(), "a refused flag created the store");
}
