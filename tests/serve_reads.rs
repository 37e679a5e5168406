//! `GET /orgs/{org}/balances` on `idem serve` never claims: a tenant never written answers
//! empty and leaves nothing in the store; an org another server holds is read from the
//! store's published state, and that server keeps it.

mod common;

use std::path::Path;

use common::{Server, TestResult, client};
use serde_json::{Value, json};

/// Every file under `dir`, relative to it.
fn files(dir: &Path) -> TestResult<Vec<String>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        if !d.exists() {
            continue;
        }
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p.strip_prefix(dir)?.display().to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

async fn balances(url: &str, org: &str) -> TestResult<(u16, Value)> {
    let resp = client()
        .get(format!("{url}/orgs/{org}/balances"))
        .send()
        .await?;
    Ok((resp.status().as_u16(), resp.json().await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_claim_nothing_and_a_tenant_never_written_leaves_no_trace() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let a = Server::start(&store, &dir.path().join("a"), "a", &[])?;
    let b = Server::start(&store, &dir.path().join("b"), "b", &[])?;

    let (status, body) = balances(&a.url, "ghost").await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"org": "ghost", "source": "store", "snapshot_seq": null, "balances": {}})
    );
    assert_eq!(
        files(&store)?,
        Vec::<String>::new(),
        "a read wrote to the store"
    );

    let resp = client()
        .post(format!("{}/orgs/acme/transfers", a.url))
        .header("Idempotency-Key", "t-1")
        .json(&json!({"from": "alice", "to": "bob", "cents": 5}))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 201);
    let before = files(&store)?;

    // B does not hold acme: it reads the published state and writes nothing.
    let (status, body) = balances(&b.url, "acme").await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["source"], "store");
    assert_eq!(body["balances"], json!({"alice": -5, "bob": 5}));
    assert!(body["snapshot_seq"].as_u64().is_some(), "{body}");
    assert_eq!(files(&store)?, before, "B's read wrote to the store");

    // A still holds acme: its writer answers, and it acknowledges more.
    let (_, body) = balances(&a.url, "acme").await?;
    assert_eq!(body["source"], "writer", "{body}");
    let resp = client()
        .post(format!("{}/orgs/acme/transfers", a.url))
        .header("Idempotency-Key", "t-2")
        .json(&json!({"from": "alice", "to": "bob", "cents": 5}))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 201, "A was fenced by B's read");
    Ok(())
}
