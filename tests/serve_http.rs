//! `idem serve` over real HTTP on 127.0.0.1: the Idempotency-Key rules of the IETF draft
//! (400, 409, 422, replay header) and a SIGTERM handoff to a second server while a client
//! keeps retrying.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Server, TestResult, client, sample, wait_until};
use serde_json::{Value, json};

async fn post(
    http: &reqwest::Client,
    url: &str,
    org: &str,
    key: Option<&str>,
    body: &Value,
) -> TestResult<(u16, bool, Vec<u8>)> {
    let mut req = http.post(format!("{url}/orgs/{org}/transfers")).json(body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let replayed = resp
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    Ok((status, replayed, resp.bytes().await?.to_vec()))
}

#[tokio::test]
async fn bad_requests_are_400_and_replays_are_marked() -> TestResult {
    let dir = tempfile::tempdir()?;
    let srv = Server::start(
        &dir.path().join("store"),
        &dir.path().join("data"),
        "t",
        &[],
    )?;
    let http = client();
    let body = json!({"from": "alice", "to": "bob", "cents": 250});

    let (s, _, _) = post(&http, &srv.url, "acme", None, &body).await?;
    assert_eq!(s, 400, "missing Idempotency-Key");
    let (s, _, _) = post(&http, &srv.url, "x..y", Some("k1"), &body).await?;
    assert_eq!(s, 400, "bad org id");
    let bad = json!({"from": "alice", "to": "alice", "cents": 1});
    let (s, _, _) = post(&http, &srv.url, "acme", Some("k1"), &bad).await?;
    assert_eq!(s, 400, "invalid transfer");

    let (s, replayed, first) = post(&http, &srv.url, "acme", Some("k1"), &body).await?;
    assert_eq!((s, replayed), (201, false));
    let (s, replayed, again) = post(&http, &srv.url, "acme", Some("k1"), &body).await?;
    assert_eq!((s, replayed), (201, true));
    assert_eq!(
        first, again,
        "a replay returns the stored response byte for byte"
    );

    let other = json!({"from": "alice", "to": "bob", "cents": 251});
    let (s, _, _) = post(&http, &srv.url, "acme", Some("k1"), &other).await?;
    assert_eq!(s, 422, "same key, different payload");

    let bal: Value = http
        .get(format!("{}/orgs/acme/balances", srv.url))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(bal["balances"], json!({"alice": -250, "bob": 250}));
    assert_eq!(
        bal["source"], "writer",
        "the replica holding the org answers from it"
    );
    Ok(())
}

#[tokio::test]
async fn same_key_in_flight_is_409() -> TestResult {
    let dir = tempfile::tempdir()?;
    let hold = dir.path().join("hold");
    std::fs::create_dir_all(&hold)?;
    let srv = Server::start(
        &dir.path().join("store"),
        &dir.path().join("data"),
        "t",
        &[("IDEM_TEST_HOLD_DIR", &hold)],
    )?;
    let http = client();
    let body = json!({"from": "a", "to": "b", "cents": 5});
    let first = {
        let (http, url, body) = (http.clone(), srv.url.clone(), body.clone());
        tokio::spawn(async move {
            post(&http, &url, "acme", Some("hold-1"), &body)
                .await
                .unwrap()
        })
    };
    // The first request is registered in flight and parked before applying.
    let held = hold.join("hold-1.held");
    assert!(
        tokio::task::spawn_blocking(move || wait_until(20, || held.exists())).await?,
        "first request never reached the hold point"
    );
    let (s, _, _) = post(&http, &srv.url, "acme", Some("hold-1"), &body).await?;
    assert_eq!(s, 409);
    std::fs::write(hold.join("hold-1.go"), b"")?;
    let (s, replayed, _) = first.await?;
    assert_eq!((s, replayed), (201, false));
    let (s, replayed, _) = post(&http, &srv.url, "acme", Some("hold-1"), &body).await?;
    assert_eq!(
        (s, replayed),
        (201, true),
        "after the first finishes, the key replays"
    );
    Ok(())
}

#[tokio::test]
async fn sigterm_hands_off_to_a_second_server_while_a_client_retries() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let mut a = Server::start(&store, &dir.path().join("data-a"), "a", &[])?;
    let b = Server::start(&store, &dir.path().join("data-b"), "b", &[])?;
    let target = Arc::new(std::sync::RwLock::new(a.url.clone()));
    let acked = Arc::new(AtomicUsize::new(0));
    let n = 40;
    let worker = {
        let (target, acked) = (target.clone(), acked.clone());
        tokio::spawn(async move {
            let http = client();
            let mut bodies = Vec::new();
            for i in 0..n {
                let key = format!("t-{i}");
                let body = json!({"from": "x", "to": "y", "cents": i + 1});
                loop {
                    let url = target.read().unwrap().clone();
                    match post(&http, &url, "acme", Some(&key), &body).await {
                        Ok((201, _, b)) => {
                            bodies.push((key, body, b));
                            break;
                        }
                        Ok((409 | 503, _, _)) | Err(_) => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Ok((s, _, b)) => panic!("unexpected {s}: {}", String::from_utf8_lossy(&b)),
                    }
                }
                acked.fetch_add(1, Ordering::SeqCst);
            }
            bodies
        })
    };
    let a2 = acked.clone();
    assert!(
        tokio::task::spawn_blocking(move || wait_until(30, || a2.load(Ordering::SeqCst) >= n / 2))
            .await?
    );
    *target.write().unwrap() = b.url.clone();
    let status =
        tokio::task::spawn_blocking(move || a.terminate().map_err(|e| e.to_string())).await??;
    assert!(status.success(), "A exits 0 after releasing");
    let bodies = worker.await?;
    assert_eq!(bodies.len(), n);

    // Every acknowledged request replays from B with its original receipt, and the balance
    // holds each transfer exactly once.
    let http = client();
    for (key, body, receipt) in &bodies {
        let (s, replayed, again) = post(&http, &b.url, "acme", Some(key), body).await?;
        assert_eq!((s, replayed), (201, true), "{key}");
        assert_eq!(&again, receipt, "{key}");
    }
    let total: i64 = (1..=i64::try_from(n)?).sum();
    let bal: Value = http
        .get(format!("{}/orgs/acme/balances", b.url))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(bal["balances"], json!({"x": -total, "y": total}));
    Ok(())
}

/// Regression: the default writer id held the pid, so a restart after `kill -9` answered 503
/// for a whole lease on every org; and a lease "of the same writer" never blocked, so two
/// live servers configured with one id took orgs from each other.
#[tokio::test]
async fn a_restart_after_kill_9_claims_at_once_and_a_twin_id_waits() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let long = ["--lease-ms", "600000"];
    let http = client();
    let body = json!({"from": "alice", "to": "bob", "cents": 5});
    let mut first = Server::start_with(&store, &dir.path().join("data"), &long, &[])?;
    assert_eq!(
        post(&http, &first.url, "acme", Some("k1"), &body).await?.0,
        201
    );
    first.child.kill()?;
    first.child.wait()?;
    // Same data directory, default id: the dead process's 10-minute lease does not block.
    let again = Server::start_with(&store, &dir.path().join("data"), &long, &[])?;
    let (s, replayed, _) = post(&http, &again.url, "acme", Some("k1"), &body).await?;
    assert_eq!((s, replayed), (201, true), "the restart replays k1 at once");
    assert_eq!(
        post(&http, &again.url, "acme", Some("k2"), &body).await?.0,
        201
    );
    // Two live servers with one configured id: the second waits, the first keeps its org.
    let twin_args = ["--lease-ms", "600000", "--writer", "same"];
    let a = Server::start_with(&store, &dir.path().join("a"), &twin_args, &[])?;
    let b = Server::start_with(&store, &dir.path().join("b"), &twin_args, &[])?;
    assert_eq!(post(&http, &a.url, "beta", Some("k1"), &body).await?.0, 201);
    let (s, _, refused) = post(&http, &b.url, "beta", Some("k2"), &body).await?;
    assert_eq!(s, 503);
    // One readable line: the org named once, and how long a claim here still waits.
    let why: Value = serde_json::from_slice(&refused)?;
    let why = why["error"].as_str().unwrap_or_default().to_owned();
    assert_eq!(why.matches("org beta").count(), 1, "{why}");
    assert!(
        why.contains("leased by writer same: claimable after 11m"),
        "{why}"
    );
    assert_eq!(post(&http, &a.url, "beta", Some("k3"), &body).await?.0, 201);
    // The replica that does not hold the org reads the store's newest state, claiming nothing.
    let bal: Value = http
        .get(format!("{}/orgs/beta/balances", b.url))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(bal["source"], "store");
    assert_eq!(bal["balances"], json!({"alice": -10, "bob": 10}));
    assert_eq!(
        post(&http, &a.url, "beta", Some("k4"), &body).await?.0,
        201,
        "a was not fenced"
    );
    Ok(())
}

/// Regression: the same `Idempotency-Key` field sent twice, or one field holding `k, k`, was
/// accepted (the second as the literal key `k, k`: one logical request ran twice), and a key
/// with a TAB was stored. The header is one Structured Field item: a quoted key is its
/// content, anything that is not one visible-ASCII value is 400 with the JSON error body.
#[tokio::test]
async fn the_idempotency_key_is_one_visible_ascii_value() -> TestResult {
    let dir = tempfile::tempdir()?;
    let srv = Server::start(
        &dir.path().join("store"),
        &dir.path().join("data"),
        "t",
        &[],
    )?;
    let http = client();
    let body = json!({"from": "alice", "to": "bob", "cents": 7});
    let url = format!("{}/orgs/acme/transfers", srv.url);
    let send = |keys: Vec<&'static [u8]>| {
        let mut req = http.post(&url).json(&body);
        for k in keys {
            req = req.header(
                "Idempotency-Key",
                reqwest::header::HeaderValue::from_bytes(k).unwrap(),
            );
        }
        req.send()
    };
    for keys in [
        vec![&b"k"[..], &b"k"[..]],
        vec![&b"k, k"[..]],
        vec![&b"k\tx"[..]],
        vec![&b"k x"[..]],
        vec![&b"\"unterminated"[..]],
        vec![&b"\"a\" b"[..]],
    ] {
        let resp = send(keys.clone()).await?;
        assert_eq!(resp.status().as_u16(), 400, "{keys:?}");
        let err: Value = resp.json().await?;
        assert_eq!(err["kind"], "input", "{keys:?}: {err}");
    }
    let first = send(vec![b"\"abc\""]).await?;
    assert_eq!(first.status().as_u16(), 201);
    let bare = send(vec![b"abc"]).await?;
    assert_eq!(bare.status().as_u16(), 201);
    assert_eq!(
        bare.headers()["idempotent-replayed"],
        "true",
        "\"abc\" is the key abc"
    );
    Ok(())
}

/// Regression: a client that sent its headers and half its body kept a SIGTERMed server alive
/// (renewing its leases) for as long as it held the connection, and a successor answered 503
/// for every org. The drain is bounded: the server releases every org and exits 0.
#[tokio::test]
async fn sigterm_with_a_half_sent_body_exits_after_the_drain_timeout() -> TestResult {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let args = [
        "--writer",
        "a",
        "--lease-ms",
        "600000",
        "--drain-timeout",
        "1s",
    ];
    let mut a = Server::start_with(&store, &dir.path().join("a"), &args, &[])?;
    let http = client();
    let body = json!({"from": "alice", "to": "bob", "cents": 3});
    assert_eq!(post(&http, &a.url, "acme", Some("k1"), &body).await?.0, 201);
    let addr = a.url.trim_start_matches("http://").to_owned();
    let mut half = tokio::net::TcpStream::connect(&addr).await?;
    half.write_all(
        b"POST /orgs/acme/transfers HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k2\r\n\
          Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"from\":",
    )
    .await?;
    let idle = tokio::net::TcpStream::connect(&addr).await?;
    let status =
        tokio::task::spawn_blocking(move || a.terminate().map_err(|e| e.to_string())).await??;
    assert!(status.success(), "{status}");
    drop((half, idle));
    // Released: a successor with another id claims at once despite the 10-minute lease.
    let b = Server::start_with(&store, &dir.path().join("b"), &["--writer", "b"], &[])?;
    let (s, replayed, _) = post(&http, &b.url, "acme", Some("k1"), &body).await?;
    assert_eq!((s, replayed), (201, true));
    Ok(())
}

#[tokio::test]
async fn metrics_count_a_known_workload() -> TestResult {
    let dir = tempfile::tempdir()?;
    let srv = Server::start(
        &dir.path().join("store"),
        &dir.path().join("data"),
        "t",
        &[],
    )?;
    let http = client();
    let body = json!({"from": "alice", "to": "bob", "cents": 5});
    for k in ["m1", "m2", "m3"] {
        assert_eq!(post(&http, &srv.url, "acme", Some(k), &body).await?.0, 201);
    }
    for k in ["m1", "m2"] {
        assert!(
            post(&http, &srv.url, "acme", Some(k), &body).await?.1,
            "replayed"
        );
    }
    let other = json!({"from": "alice", "to": "bob", "cents": 6});
    assert_eq!(
        post(&http, &srv.url, "acme", Some("m1"), &other).await?.0,
        422
    );
    assert_eq!(post(&http, &srv.url, "acme", None, &body).await?.0, 400);
    assert_eq!(
        post(&http, &srv.url, "Acme", Some("m9"), &body).await?.0,
        400
    );

    let text = http
        .get(format!("{}/metrics", srv.url))
        .send()
        .await?
        .text()
        .await?;
    let n = |series: &str| sample(&text, series).ok_or(format!("no {series} in\n{text}"));
    assert_eq!(n(r#"idem_requests_total{outcome="applied"}"#)?, 3.0);
    assert_eq!(n(r#"idem_requests_total{outcome="replayed"}"#)?, 2.0);
    assert_eq!(n(r#"idem_requests_total{outcome="mismatch"}"#)?, 1.0);
    assert_eq!(n(r#"idem_requests_total{outcome="input"}"#)?, 2.0);
    assert_eq!(n(r#"idem_ack_seconds_count{outcome="applied"}"#)?, 3.0);
    assert_eq!(n("idem_open_orgs")?, 1.0);
    assert!(n("idem_hydrate_seconds_count")? >= 1.0);
    // Every acknowledged first run was shipped: at least one full snapshot, then deltas.
    let ships = ["full", "delta", "compacted"]
        .iter()
        .filter_map(|k| sample(&text, &format!(r#"idem_ships_total{{kind="{k}"}}"#)))
        .sum::<f64>();
    assert!((1.0..=6.0).contains(&ships), "ships {ships}");
    assert!(n(r#"idem_ships_total{kind="full"}"#)? >= 1.0);
    assert!(n("idem_shipped_bytes_total")? > 0.0);
    assert!(n(r#"idem_store_requests_total{op="put"}"#)? >= 2.0 * ships);
    for ty in [
        "# TYPE idem_requests_total counter",
        "# TYPE idem_ack_seconds histogram",
        "# TYPE idem_open_orgs gauge",
    ] {
        assert!(text.contains(ty), "{ty} in\n{text}");
    }
    Ok(())
}

/// A rolling upgrade's client is told where to go: a replica refused by another's live
/// lease answers 503 with `Retry-After` of the lease's remaining seconds and the holder's
/// advertised address.
#[tokio::test]
async fn a_held_org_names_its_holder_and_when_its_lease_ends() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let a = Server::start_with(
        &store,
        &dir.path().join("a"),
        &["--writer", "a", "--advertise", "http://a.example:8080"],
        &[],
    )?;
    let b = Server::start_with(&store, &dir.path().join("b"), &["--writer", "b"], &[])?;
    let http = client();
    let body = json!({"from": "alice", "to": "bob", "cents": 5});
    assert_eq!(post(&http, &a.url, "acme", Some("k1"), &body).await?.0, 201);
    let resp = http
        .post(format!("{}/orgs/acme/transfers", b.url))
        .header("Idempotency-Key", "k2")
        .json(&body)
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 503);
    let wait: u64 = resp
        .headers()
        .get("retry-after")
        .ok_or("no Retry-After")?
        .to_str()?
        .parse()?;
    // B never saw A's lease before: it watches a whole term plus a tenth (30 s + 3 s).
    assert_eq!(wait, 33, "the watch's remaining seconds, not 1");
    let err: Value = resp.json().await?;
    assert_eq!(err["holder"], "http://a.example:8080", "{err}");
    assert_eq!(err["kind"], "retry");
    Ok(())
}
