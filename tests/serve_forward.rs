//! `idem serve --forward` over real HTTP: a replica that does not hold an org forwards the
//! request to the holder's advertised address and relays its answer (replay header and
//! all); a holder that stops answering mid-way makes the forward a 503, and the retried
//! request applies once on the replica that takes the org over.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Server, TestResult, client, idem};
use serde_json::{Value, json};

/// An `idem serve` on a port chosen here, advertising that address (the port is free when
/// chosen; a server that cannot bind it fails the test).
fn advertised(store: &Path, data: &Path, writer: &str, extra: &[&str]) -> TestResult<Server> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut cmd = idem();
    cmd.arg("serve")
        .arg("--store")
        .arg(store)
        .arg("--data")
        .arg(data)
        .args(["--listen", &addr, "--writer", writer])
        .args(["--advertise", &format!("http://{addr}")])
        .args(extra)
        .stderr(std::process::Stdio::null());
    Server::spawn(cmd)
}

async fn post(url: &str, key: &str, cents: i64) -> TestResult<(u16, bool, Vec<u8>)> {
    let resp = client()
        .post(format!("{url}/orgs/acme/transfers"))
        .header("Idempotency-Key", key)
        .json(&json!({"from": "x", "to": "y", "cents": cents}))
        .send()
        .await?;
    let status = resp.status().as_u16();
    let replayed = resp
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    Ok((status, replayed, resp.bytes().await?.to_vec()))
}

async fn balances(url: &str) -> TestResult<Value> {
    let v: Value = client()
        .get(format!("{url}/orgs/acme/balances"))
        .send()
        .await?
        .json()
        .await?;
    Ok(v["balances"].clone())
}

#[tokio::test]
async fn a_replica_that_does_not_hold_the_org_forwards_and_relays_the_holders_answer() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let a = advertised(&store, &dir.path().join("a"), "a", &[])?;
    let b = Server::start_with(
        &store,
        &dir.path().join("b"),
        &["--writer", "b", "--forward"],
        &[],
    )?;
    assert_eq!(post(&a.url, "k1", 5).await?.0, 201);

    // Through B: the holder runs it, B relays the receipt.
    let (status, replayed, receipt) = post(&b.url, "k2", 7).await?;
    assert_eq!((status, replayed), (201, false));
    // Again through B, and at A: one stored receipt, replayed byte for byte.
    assert_eq!(post(&b.url, "k2", 7).await?, (201, true, receipt.clone()));
    assert_eq!(post(&a.url, "k2", 7).await?, (201, true, receipt));
    // Another payload under the key, through B: the holder's 422.
    assert_eq!(post(&b.url, "k2", 8).await?.0, 422);
    assert_eq!(balances(&a.url).await?, json!({"x": -12, "y": 12}));
    Ok(())
}

#[tokio::test]
async fn a_forward_whose_holder_stops_answering_is_a_503_and_the_retry_applies_once() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let lease = ["--lease-ms", "2000"];
    let mut a = advertised(&store, &dir.path().join("a"), "a", &lease)?;
    let b = Server::start_with(
        &store,
        &dir.path().join("b"),
        &[
            "--writer",
            "b",
            "--forward",
            "--forward-timeout",
            "1s",
            "--lease-ms",
            "2000",
        ],
        &[],
    )?;
    assert_eq!(post(&a.url, "k1", 5).await?.0, 201);

    // A stops: its socket still accepts, nothing answers. The forward times out.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(a.child.id())?);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)?;
    let (status, _, body) = post(&b.url, "k2", 7).await?;
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    let err: Value = serde_json::from_slice(&body)?;
    assert_eq!(err["kind"], "retry", "{err}");

    // A dies without answering; the client retries under the same key until B, having
    // watched A's lease lapse, takes the org.
    a.signal(nix::sys::signal::Signal::SIGKILL)?;
    let mut answered = None;
    for _ in 0..200 {
        match post(&b.url, "k2", 7).await? {
            (201, replayed, _) => {
                answered = Some(replayed);
                break;
            }
            (503, _, _) => tokio::time::sleep(Duration::from_millis(100)).await,
            (s, _, b) => return Err(format!("{s}: {}", String::from_utf8_lossy(&b)).into()),
        }
    }
    assert_eq!(answered, Some(false), "B applied k2 (A never ran it)");
    assert!(post(&b.url, "k2", 7).await?.1, "then replays it");
    assert_eq!(
        balances(&b.url).await?,
        json!({"x": -12, "y": 12}),
        "each once"
    );
    Ok(())
}
