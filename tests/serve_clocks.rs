//! Leases no clock can fool (I15), black-box: two `idem serve` processes on one local store,
//! one of them under libfaketime (Debian's `faketime` package), which fakes its wall clock
//! only (`FAKETIME_DONT_FAKE_MONOTONIC=1`: its monotonic clock tells the truth). Clients send
//! to both. A live holder keeps its orgs whatever the clocks say, and a dead holder's orgs
//! move within a watch (the lease plus a tenth) of the successor's own monotonic clock.
//!
//! These tests fail, never skip, where libfaketime is missing (`apt-get install -y faketime`).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use idem_base::{Clock, Stopwatch, SystemClock};

use common::{Server, TestResult, idem, libfaketime, serve_command};
use serde_json::{Value, json};

const LEASE_MS: u64 = 2_000;
/// The watch a successor keeps before it takes a lease for lapsed.
const WATCH: Duration = Duration::from_millis(LEASE_MS + LEASE_MS / 10);
/// What a loaded machine may add to a claim after the watch (hydrate, first ship, polling).
const SLACK: Duration = Duration::from_secs(5);
const HOUR_MS: u64 = 3_600_000;

/// `idem serve` of writer `writer` on `store`, its wall clock faked by libfaketime from
/// `spec_file` when given (the monotonic clock stays true).
fn start(store: &Path, data: &Path, writer: &str, spec_file: Option<&Path>) -> TestResult<Server> {
    let lease = LEASE_MS.to_string();
    let mut cmd = serve_command(store, data, &["--writer", writer, "--lease-ms", &lease]);
    if let Some(spec_file) = spec_file {
        cmd.env("LD_PRELOAD", libfaketime()?)
            .env("FAKETIME_TIMESTAMP_FILE", spec_file)
            .env("FAKETIME_CACHE_DURATION", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env_remove("FAKETIME");
    }
    cmd.stderr(std::process::Stdio::null());
    Server::spawn(cmd)
}

fn client() -> TestResult<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()?)
}

/// Servers `a` and `b` on one store; `faked` ("a" or "b") runs with its wall clock read from
/// `spec` (libfaketime's format, for example `+1h`), which the test may rewrite.
struct Pair {
    dir: tempfile::TempDir,
    store: PathBuf,
    spec: PathBuf,
    http: reqwest::Client,
    a: Server,
    b: Server,
}

impl Pair {
    fn start(faked: &str, spec: &str) -> TestResult<Pair> {
        let dir = tempfile::tempdir()?;
        let store = dir.path().join("store");
        let spec_file = dir.path().join("faketime.spec");
        std::fs::write(&spec_file, spec)?;
        let spec = |name: &str| (name == faked).then_some(spec_file.as_path());
        let a = start(&store, &dir.path().join("a"), "a", spec("a"))?;
        let b = start(&store, &dir.path().join("b"), "b", spec("b"))?;
        Ok(Pair {
            http: client()?,
            spec: spec_file,
            store,
            dir,
            a,
            b,
        })
    }
}

/// POSTs a transfer with key `key` to `org` on `url`: the status and `Retry-After`.
async fn post(
    http: &reqwest::Client,
    url: &str,
    org: &str,
    key: &str,
) -> TestResult<(u16, Option<u64>)> {
    let resp = http
        .post(format!("{url}/orgs/{org}/transfers"))
        .header("Idempotency-Key", key)
        .json(&json!({"from": "alice", "to": "bob", "cents": 1}))
        .send()
        .await?;
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    Ok((resp.status().as_u16(), retry))
}

fn real_now_ms() -> u64 {
    SystemClock.now_ms()
}

/// The wall-clock expiry the holder of `org` (its newest claim's claimer) last wrote into its
/// process lease (its own clock, which is what these tests fake).
fn holders_written_expiry(store: &Path, org: &str) -> TestResult<u64> {
    // The newest claim entry names its claimer's process lease (no org lease is written).
    let mut entries: Vec<_> = std::fs::read_dir(store.join(format!("orgs/{org}/log")))?
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    let mut claim = None;
    for path in entries.iter().rev() {
        let entry: Value = serde_json::from_slice(&std::fs::read(path)?)?;
        if entry["kind"] == "claim" {
            claim = Some(entry);
            break;
        }
    }
    let claim = claim.ok_or("no claim entry")?;
    let instance = claim["instance"].as_str().ok_or("no instance")?;
    let process: Value = serde_json::from_slice(&std::fs::read(
        store.join(format!("processes/{instance}.json")),
    )?)?;
    process["expires_at_ms"]
        .as_u64()
        .ok_or_else(|| "no expiry".into())
}

/// For three watches, clients send to both servers: `holder` answers 201 for `org` every
/// time, `other` 503 with a `Retry-After` no longer than a watch.
async fn holder_keeps(
    http: &reqwest::Client,
    holder: &Server,
    other: &Server,
    org: &str,
    tag: &str,
) -> TestResult {
    let watch = Stopwatch::start();
    let until = 3 * WATCH;
    let mut i = 0;
    while watch.elapsed() < until {
        i += 1;
        let (s, _) = post(http, &holder.url, org, &format!("{tag}-h{i}")).await?;
        assert_eq!(s, 201, "the live holder lost {org} ({tag}, request {i})");
        let (s, retry) = post(http, &other.url, org, &format!("{tag}-o{i}")).await?;
        assert_eq!(
            s, 503,
            "{org} moved from its live holder ({tag}, request {i})"
        );
        let retry = retry.ok_or("a 503 without Retry-After")?;
        assert!(
            (1..=WATCH.as_secs() + 1).contains(&retry),
            "Retry-After {retry} s for a watch of {WATCH:?}"
        );
        // Pacing of the clients, not an ordering: every answer above is checked as it comes.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    Ok(())
}

/// Kills `holder` (SIGKILL: nothing released) and polls `successor` for `org` until it
/// answers 201: the time that took, which must lie within the watch's bounds.
async fn moves_within_a_watch(
    http: &reqwest::Client,
    mut holder: Server,
    successor: &Server,
    org: &str,
) -> TestResult<Duration> {
    holder.child.kill()?;
    holder.child.wait()?;
    let killed = Stopwatch::start();
    let mut i = 0;
    let took = loop {
        i += 1;
        let (s, _) = post(http, &successor.url, org, &format!("after-{i}")).await?;
        if s == 201 {
            break killed.elapsed();
        }
        assert_eq!(s, 503, "request {i} after the kill");
        if killed.elapsed() > WATCH + SLACK {
            return Err(format!(
                "{org} still held {:?} after its holder died (watch {WATCH:?})",
                killed.elapsed()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The successor's watch starts no earlier than the holder's last renewal, a third of a
    // lease before it died (more only if its renewals stalled): a claim within half a watch
    // of the kill trusted something other than what it saw.
    assert!(
        took >= WATCH / 2,
        "{org} moved {took:?} after its holder died, before a watch ({WATCH:?}) could pass"
    );
    eprintln!("{org} moved {took:?} after its holder's SIGKILL (watch {WATCH:?})");
    Ok(took)
}

/// Regression (issue 25): replica B's wall clock an hour ahead took org o from live A at
/// once (A's lease "expired" by B's clock); A answered `fenced`, then `leased by B`.
#[tokio::test]
#[ignore = "needs libfaketime (Debian's faketime package)"]
async fn a_replica_an_hour_ahead_never_takes_a_live_holders_org_and_takes_a_dead_ones_within_a_watch()
-> TestResult {
    // `_dir` keeps the store and data directories until the end of the test.
    let Pair {
        dir: _dir,
        store,
        http,
        a,
        b,
        ..
    } = Pair::start("b", "+1h")?;
    assert_eq!(post(&http, &a.url, "acme", "k1").await?.0, 201);
    // B's clock really is an hour ahead: the lease it writes for an org of its own says so.
    assert_eq!(post(&http, &b.url, "beta", "k1").await?.0, 201);
    let written = holders_written_expiry(&store, "beta")?;
    assert!(
        written > real_now_ms() + HOUR_MS / 2,
        "libfaketime did not move B's wall clock: {written}"
    );
    // `idem inspect` (a one-shot process that never watched the lease) says what a claim
    // from it would wait, the holder's term and a tenth, and shows the holder's hour-ahead
    // expiry as the holder's clock, deciding nothing from it.
    let out = idem()
        .args(["inspect", "beta", "--json", "--store"])
        .arg(&store)
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    let lease = &v["lease"];
    assert_eq!(
        (
            &lease["writer"],
            &lease["released"],
            &lease["claim_wait_ms"]
        ),
        (&json!("b"), &json!(false), &json!(WATCH.as_millis() as u64)),
        "{v}"
    );
    let shown = lease["holder_expires_at"]
        .as_str()
        .ok_or("no holder expiry")?;
    let shown = humantime::parse_rfc3339(shown)?;
    assert!(
        shown > SystemClock.now() + Duration::from_secs(1_800),
        "{shown:?}"
    );
    holder_keeps(&http, &a, &b, "acme", "live").await?;
    moves_within_a_watch(&http, a, &b, "acme").await?;
    // What A acknowledged replays from B.
    let (s, _) = post(&http, &b.url, "acme", "k1").await?;
    assert_eq!(s, 201);
    Ok(())
}

/// Regression (issue 25): A's wall clock stepped back an hour while serving; B claimed o from
/// live A, and after B's SIGKILL A could not serve o again for the hour B's lease seemed to
/// have left by A's clock.
#[tokio::test]
#[ignore = "needs libfaketime (Debian's faketime package)"]
async fn a_replica_whose_clock_steps_back_an_hour_keeps_its_org_and_takes_a_dead_ones_within_a_watch()
-> TestResult {
    let Pair {
        dir: _dir,
        store,
        spec,
        http,
        a,
        b,
    } = Pair::start("a", "+0")?;
    assert_eq!(post(&http, &a.url, "acme", "k1").await?.0, 201);
    assert_eq!(post(&http, &b.url, "beta", "k1").await?.0, 201);
    // A's wall clock steps back an hour (an NTP step): A serves on, and its next renewal
    // shows the step in the store.
    std::fs::write(&spec, "-1h")?;
    let watch = Stopwatch::start();
    let stepped = Duration::from_secs(20);
    let mut i = 0;
    while holders_written_expiry(&store, "acme")? > real_now_ms() {
        i += 1;
        assert_eq!(
            post(&http, &a.url, "acme", &format!("step-{i}")).await?.0,
            201
        );
        assert!(
            watch.elapsed() < stepped,
            "A's wall clock never stepped back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    holder_keeps(&http, &a, &b, "acme", "stepped").await?;
    holder_keeps(&http, &b, &a, "beta", "stepped").await?;
    moves_within_a_watch(&http, b, &a, "beta").await?;
    assert_eq!(post(&http, &a.url, "acme", "k2").await?.0, 201);
    Ok(())
}
