//! Logging is never on the acknowledgement path, and no signal but SIGKILL ends `idem serve`
//! without releasing its orgs: real processes, real pipes, real HTTP.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Stdio;

use common::{Server, TestResult, client, metrics_text, sample, serve_command};
use nix::sys::signal::Signal;
use serde_json::json;

async fn post(http: &reqwest::Client, url: &str, org: &str, key: &str) -> TestResult<(u16, bool)> {
    let resp = http
        .post(format!("{url}/orgs/{org}/transfers"))
        .header("Idempotency-Key", key)
        .json(&json!({"from": "alice", "to": "bob", "cents": 5}))
        .send()
        .await?;
    let replayed = resp
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    Ok((resp.status().as_u16(), replayed))
}

/// Sends `sig` to `a`, which must exit 0; then a successor with another writer id (data in
/// `data`) claims `acme` at once despite `a`'s 10-minute lease, which proves `a` released it:
/// `k1` replays from the successor.
async fn stops_and_hands_off(
    mut a: Server,
    sig: Signal,
    store: &std::path::Path,
    data: &std::path::Path,
) -> TestResult {
    let status =
        tokio::task::spawn_blocking(move || a.signal(sig).map_err(|e| e.to_string())).await??;
    assert_eq!(status.code(), Some(0), "{sig}: {status}");
    let b = Server::start_with(store, data, &["--writer", "b"], &[])?;
    let (s, replayed) = post(&client(), &b.url, "acme", "k1").await?;
    assert_eq!(
        (s, replayed),
        (201, true),
        "released: the successor claims at once"
    );
    Ok(())
}

/// `idem serve` as writer `a` with a 10-minute lease, `env` set and its stderr a pipe whose
/// read end the test holds (`child.stderr`).
fn with_piped_stderr(
    store: &std::path::Path,
    data: &std::path::Path,
    env: &[(&str, &str)],
) -> TestResult<Server> {
    let mut cmd = serve_command(store, data, &["--writer", "a", "--lease-ms", "600000"]);
    cmd.envs(env.iter().copied()).stderr(Stdio::piped());
    Server::spawn(cmd)
}

/// Regression: with `idem serve 2>&1 | log-shipper` and the shipper dead, every log line
/// hit EPIPE, tracing-subscriber reported it with `eprintln!` (a panic on a closed stderr),
/// requests hung and SIGTERM exited 101 without releasing. A failed write is dropped and
/// counted; the server acknowledges, and SIGTERM still drains, releases and exits 0.
#[tokio::test]
async fn a_dead_stderr_reader_never_stops_acknowledgements_or_the_release() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    // Debug logs: every request writes lines, so every request meets the broken pipe.
    let mut a = with_piped_stderr(&store, &dir.path().join("a"), &[("IDEM_LOG", "debug")])?;
    // The log shipper dies: the read end of the server's stderr closes.
    drop(a.child.stderr.take());
    let http = client();
    for i in 0..20 {
        let (s, _) = post(&http, &a.url, "acme", &format!("k{}", i + 1)).await?;
        assert_eq!(s, 201, "request {i} acknowledged");
    }
    let text = metrics_text(&a.url).await?;
    let failed = sample(&text, "idem_log_write_failures_total")
        .ok_or_else(|| format!("no idem_log_write_failures_total in\n{text}"))?;
    assert!(
        failed >= 20.0,
        "every request's lines were dropped: {failed}"
    );
    stops_and_hands_off(a, Signal::SIGTERM, &store, &dir.path().join("b")).await
}

/// Regression: SIGHUP (the SSH session that started the server closes) killed it without a
/// release, so a successor waited out the whole lease. SIGHUP drains and releases like
/// SIGTERM.
#[tokio::test]
async fn sighup_drains_and_releases_like_sigterm() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let args = ["--writer", "a", "--lease-ms", "600000"];
    let a = Server::start_with(&store, &dir.path().join("a"), &args, &[])?;
    assert_eq!(post(&client(), &a.url, "acme", "k1").await?.0, 201);
    stops_and_hands_off(a, Signal::SIGHUP, &store, &dir.path().join("b")).await
}

/// A stderr reader that is alive but never reads (a stalled shipper): the pipe fills, yet
/// requests are acknowledged, lines beyond the bounded queue are counted as dropped, and
/// SIGTERM still exits 0 after releasing.
#[tokio::test]
async fn a_stalled_stderr_reader_never_blocks_acknowledgements() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    // Trace logs (about 350 bytes a request) fill the pipe's 64 KiB within a few hundred
    // requests, then the 4 KiB queue (a test hook; 1 MiB by default); the test holds the
    // read end open and never reads it.
    let env = [("IDEM_LOG", "trace"), ("IDEM_TEST_LOG_QUEUE_BYTES", "4096")];
    let mut a = with_piped_stderr(&store, &dir.path().join("a"), &env)?;
    let http = client();
    let mut dropped = 0.0;
    let mut i = 0;
    // Until the queue overflowed: without the sink, the requests block once the pipe is full.
    while dropped == 0.0 {
        i += 1;
        assert!(i <= 1500, "no line was ever dropped");
        let (s, _) = post(&http, &a.url, "acme", &format!("k{i}")).await?;
        assert_eq!(s, 201, "request {i} acknowledged");
        if i % 25 == 0 {
            let text = metrics_text(&a.url).await?;
            dropped = sample(&text, "idem_log_lines_dropped_total").unwrap_or(0.0);
        }
    }
    // The reader stays stalled through the shutdown: the pipe's end is kept open here.
    let _stalled = a.child.stderr.take();
    stops_and_hands_off(a, Signal::SIGTERM, &store, &dir.path().join("b")).await
}

/// `/metrics` describes the log counters even before anything was dropped.
#[tokio::test]
async fn metrics_show_the_log_counters_at_zero() -> TestResult {
    let dir = tempfile::tempdir()?;
    let srv = Server::start(&dir.path().join("store"), &dir.path().join("a"), "a", &[])?;
    let text = metrics_text(&srv.url).await?;
    for series in [
        "idem_log_write_failures_total",
        "idem_log_lines_dropped_total",
    ] {
        assert_eq!(sample(&text, series), Some(0.0), "{series} in\n{text}");
    }
    Ok(())
}
