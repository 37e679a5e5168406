//! `idem serve --journal` (`docs/design.md` 3g, "The org layer on the journal") over real
//! HTTP: clients of several orgs are acknowledged through batches of one journal run, the
//! server's SIGTERM releases every org and seals the run, `inspect`, `snapshots`, `verify`
//! and `restore` read them, and a successor started with
//! `--journal` serves their balances and replays their keys; a replica without it reads
//! them but refuses to write them per org.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Server, TestResult, client};
use serde_json::{Value, json};

const ORGS: usize = 6;
const PER_ORG: i64 = 5;

#[tokio::test]
async fn a_journal_server_acknowledges_many_orgs_and_its_successor_reads_them() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let mut a = Server::start_with(
        &store,
        &dir.path().join("data-a"),
        &["--writer", "a", "--journal"],
        &[],
    )?;
    let mut tasks = Vec::new();
    for o in 0..ORGS {
        let url = a.url.clone();
        tasks.push(tokio::spawn(async move {
            for i in 1..=PER_ORG {
                let resp = client()
                    .post(format!("{url}/orgs/org{o}/transfers"))
                    .header("Idempotency-Key", format!("p-{i}"))
                    .json(&json!({"from": "x", "to": "y", "cents": i}))
                    .send()
                    .await?;
                assert_eq!(resp.status().as_u16(), 201, "org{o} p-{i}");
            }
            Ok::<_, reqwest::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let status =
        tokio::task::spawn_blocking(move || a.terminate().map_err(|e| e.to_string())).await??;
    assert!(status.success(), "A exits 0 after releasing");

    // The acknowledgements are in journal objects; the orgs' logs hold claims and
    // checkpoints of format 5 and Release entries, no per-org ships.
    let journals = store.join("journals");
    let objects: usize = std::fs::read_dir(&journals)?
        .map(|run| std::fs::read_dir(run.unwrap().path()).unwrap().count())
        .sum();
    assert!(objects >= 2, "{objects} journal objects");
    for o in 0..ORGS {
        for e in std::fs::read_dir(store.join(format!("orgs/org{o}/log")))? {
            let entry: Value = serde_json::from_slice(&std::fs::read(e?.path())?)?;
            // A Release entry is the same in both formats: K0 reads it after the
            // released checkpoint below it.
            if entry["kind"] != json!("release") {
                assert_eq!(entry["v"], json!(5), "org{o}: {entry}");
            }
        }
    }

    // The operator's readers follow the journal: inspect, snapshots (the checkpoints are
    // positions), verify, and restore of the newest state.
    let store_arg = store.to_str().unwrap();
    for cmd in [
        vec!["inspect", "org0", "--store", store_arg],
        vec!["snapshots", "org0", "--store", store_arg],
        vec!["verify", "org0", "--store", store_arg],
    ] {
        let out = common::run(&cmd);
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let restored = dir.path().join("org0.db");
    let out = common::run(&[
        "restore",
        "org0",
        "--store",
        store_arg,
        "--to",
        restored.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let conn = rusqlite::Connection::open(&restored)?;
    let moved: i64 = conn.query_row("SELECT count(*) FROM transfers", [], |r| r.get(0))?;
    assert_eq!(moved, PER_ORG);

    // A replica without --journal reads them from the store (a read never claims, and
    // follows the journal), but refuses to write them per org, changing nothing.
    let total: i64 = (1..=PER_ORG).sum();
    let per_org = Server::start(&store, &dir.path().join("data-p"), "p", &[])?;
    let bal: Value = client()
        .get(format!("{}/orgs/org0/balances", per_org.url))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(bal["balances"], json!({"x": -total, "y": total}));
    let refused = client()
        .post(format!("{}/orgs/org0/transfers", per_org.url))
        .header("Idempotency-Key", "p-new")
        .json(&json!({"from": "x", "to": "y", "cents": 1000}))
        .send()
        .await?;
    assert!(
        refused.status().is_server_error(),
        "a per-org replica wrote a journal org: {}",
        refused.status()
    );
    drop(per_org);

    let b = Server::start_with(
        &store,
        &dir.path().join("data-b"),
        &["--writer", "b", "--journal"],
        &[],
    )?;
    for o in 0..ORGS {
        let bal: Value = client()
            .get(format!("{}/orgs/org{o}/balances", b.url))
            .send()
            .await?
            .json()
            .await?;
        assert_eq!(bal["balances"], json!({"x": -total, "y": total}), "org{o}");
        // A replay answers the first result, and applies nothing again.
        let replay = client()
            .post(format!("{}/orgs/org{o}/transfers", b.url))
            .header("Idempotency-Key", "p-1")
            .json(&json!({"from": "x", "to": "y", "cents": 1}))
            .send()
            .await?;
        assert_eq!(replay.status().as_u16(), 201, "org{o} replay");
    }
    for o in 0..ORGS {
        let bal: Value = client()
            .get(format!("{}/orgs/org{o}/balances", b.url))
            .send()
            .await?
            .json()
            .await?;
        assert_eq!(bal["balances"], json!({"x": -total, "y": total}), "org{o}");
    }
    // B's first checkpoint of each org (its state was A's newest section, past A's release
    // seal) is that section's pages on its base: one delta entry, no snapshot.
    for o in 0..ORGS {
        let mut b_entries = Vec::new();
        for e in std::fs::read_dir(store.join(format!("orgs/org{o}/log")))? {
            let entry: Value = serde_json::from_slice(&std::fs::read(e?.path())?)?;
            if entry["writer"] == json!("b") && entry["kind"] != json!("claim") {
                b_entries.push(entry["kind"].clone());
            }
        }
        assert_eq!(b_entries, vec![json!("delta")], "org{o}");
    }
    Ok(())
}

#[test]
fn journal_and_force_claim_are_refused_together_before_the_store_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let out = common::run(&[
        "serve",
        "--store",
        store.to_str().unwrap(),
        "--data",
        dir.path().join("data").to_str().unwrap(),
        "--journal",
        "--force-claim",
    ]);
    common::assert_clean_failure(&out, "--force-claim");
    assert!(!store.exists(), "a refused flag created the store");
}
