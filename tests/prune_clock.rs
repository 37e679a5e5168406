//! Prune on a host whose clock the store contradicts, black-box: the binary run under Debian's
//! libfaketime (preloaded: the process's wall clock is shifted, while the local store's
//! Last-Modified stays the file's mtime, set by the kernel from the real clock).
//!
//! Regression guarded against: with the server's clock stepped 8 days forward, in-process
//! pruning (`idem serve --prune-every`) and a cron `idem prune --older-than 7d` deleted keys
//! acknowledged seconds earlier, and their retries got 409 "pruned" instead of their receipts.
//!
//! These tests need `faketime` (`apt-get install -y faketime`) and fail, never skip, without it.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Server, TestResult, assert_clean_failure, libfaketime};
use idem_org::replica::{OrgId, Replica, Settings};
use idem_org::{Registry, idem, rusqlite};
use serde_json::json;

const MINUTE_MS: u64 = 60_000;

/// `idem` with its wall clock shifted by `offset` (faketime's format, e.g. `+8d`). The
/// library is preloaded directly rather than through the `faketime` program, which runs its
/// command as a child and would take the signals the tests send the server.
fn idem_at(offset: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.env("LD_PRELOAD", libfaketime().expect("libfaketime"))
        .env("FAKETIME", offset);
    cmd
}

fn run_at(offset: &str, args: &[&str]) -> Output {
    idem_at(offset).args(args).output().unwrap()
}

fn real_now_ms() -> u64 {
    idem::Clock::now_ms(&idem::SystemClock)
}

/// Org `acme` released in a local store: `old-1`, `old-2` applied by a writer whose clock
/// read ten minutes ago, `new` by one whose clock reads now. Each key's result is its name.
fn seeded_store(dir: &Path) -> TestResult<PathBuf> {
    let store = dir.join("store");
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let clock = Arc::new(idem::ManualClock::new(real_now_ms() - 10 * MINUTE_MS));
        let host: Arc<dyn idem::Clock> = clock.clone();
        let replica = Replica::open_with(
            Replica::local_store(&store)?,
            "",
            Settings::default(),
            host.clone(),
            None,
        )
        .await?;
        let registry = Registry::builder(dir.join("seed"), replica, "seed")
            .clock(host)
            .build()?;
        let org = registry.acquire(&OrgId::new("acme")?).await?;
        for k in ["old-1", "old-2", "new"] {
            if k == "new" {
                clock.set(real_now_ms());
            }
            org.once(k, move |_tx| {
                Ok::<_, rusqlite::Error>(k.as_bytes().to_vec())
            })
            .await?;
        }
        registry.shutdown().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    Ok(store)
}

/// Which of `keys` replay their stored result (never running `apply`); the others ran
/// again (they had been pruned).
fn replaying(store: &Path, dir: &Path, keys: &[&str]) -> TestResult<Vec<String>> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let replica = Replica::open(Replica::local_store(store)?, "", Settings::default()).await?;
        let registry = Registry::builder(dir.join("check"), replica, "check").build()?;
        let org = registry.acquire(&OrgId::new("acme")?).await?;
        let ran = Arc::new(AtomicUsize::new(0));
        let mut replayed = Vec::new();
        for k in keys {
            let ran = ran.clone();
            let out = org
                .once(k, move |_tx| {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, rusqlite::Error>(b"ran again".to_vec())
                })
                .await?;
            if !out.applied {
                assert_eq!(out.result, k.as_bytes(), "{k} replayed another result");
                replayed.push((*k).to_owned());
            }
        }
        assert_eq!(ran.load(Ordering::SeqCst), keys.len() - replayed.len());
        registry.shutdown().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(replayed)
    })
}

#[test]
#[ignore = "needs libfaketime (Debian's faketime package)"]
fn cron_prune_on_a_host_days_off_the_stores_clock_refuses_and_every_key_replays() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let s = store.to_str().unwrap();
    for (offset, words) in [
        ("+8d", "8days ahead of the store's"),
        ("-8d", "behind the store's"),
    ] {
        let out = run_at(offset, &["prune", "--store", s, "--older-than", "7d"]);
        assert_clean_failure(&out, words);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("idem: prune refused: ") && err.contains("nothing was pruned"));
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // Refused before claiming anything: the log still ends with the seed's release.
    let inspect = common::run(&["inspect", "acme", "--store", s, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&inspect.stdout)?;
    assert_eq!(v["head"], "release", "{v}");
    let all = ["old-1", "old-2", "new"];
    assert_eq!(replaying(&store, dir.path(), &all)?, all);
    Ok(())
}

/// Four minutes ahead is inside the default bound of five: prune runs and deletes by the
/// window as before, judging each key by the store's clock where this host reads ahead of it:
/// `new`, seconds old by the store, is four minutes old by the host and stays.
#[test]
#[ignore = "needs libfaketime (Debian's faketime package)"]
fn cron_prune_within_the_bound_prunes_by_the_window_on_the_stores_clock() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let s = store.to_str().unwrap();
    let out = run_at("+4m", &["prune", "--store", s, "--older-than", "3m"]);
    let (said, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        said.starts_with("pruned 2 keys older than 3m in 1 of 1 orgs"),
        "{said}"
    );
    assert_eq!(
        replaying(&store, dir.path(), &["old-1", "old-2", "new"])?,
        ["new"]
    );
    Ok(())
}

/// A bound narrower than the host's offset refuses what the default allows.
#[test]
#[ignore = "needs libfaketime (Debian's faketime package)"]
fn cron_prune_takes_its_bound_from_max_clock_skew() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let s = store.to_str().unwrap();
    let args = [
        "prune",
        "--store",
        s,
        "--older-than",
        "5m",
        "--max-clock-skew",
        "1m",
    ];
    assert_clean_failure(&run_at("+2m", &args), "max_clock_skew_ms (60000 ms)");
    assert_eq!(
        replaying(&store, dir.path(), &["old-1", "old-2", "new"])?.len(),
        3
    );
    Ok(())
}

/// `idem serve --prune-every` on a host 8 days ahead: a key acknowledged (by a server whose
/// clock was right) replays before and after the pruner's refusal, which is logged and
/// counted, and the server still drains and exits 0 on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs libfaketime (Debian's faketime package)"]
async fn a_server_days_ahead_refuses_its_prune_and_a_key_acknowledged_before_replays() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let (store, http) = (dir.path().join("store"), reqwest::Client::new());
    let body = json!({"from": "alice", "to": "bob", "cents": 250});
    let post = |url: String| {
        let req = http
            .post(format!("{url}/orgs/acme/transfers"))
            .header("Idempotency-Key", "k1")
            .json(&body);
        async move {
            let resp = req.timeout(Duration::from_secs(20)).send().await?;
            let replayed = resp
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true");
            Ok::<_, reqwest::Error>((resp.status().as_u16(), replayed, resp.bytes().await?))
        }
    };
    let mut first = Server::start(&store, &dir.path().join("a"), "a", &[])?;
    let (status, _, receipt) = post(first.url.clone()).await?;
    assert_eq!(status, 201);
    assert!(first.terminate()?.success());

    let mut cmd = idem_at("+8d");
    cmd.arg("serve")
        .arg("--store")
        .arg(&store)
        .args(["--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path().join("b"))
        .args([
            "--writer",
            "b",
            "--prune-every",
            "1s",
            "--prune-older-than",
            "7d",
        ])
        .env("IDEM_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut skewed = Server {
        child,
        url: line
            .trim()
            .strip_prefix("listening on ")
            .ok_or(line.clone())?
            .to_owned(),
    };
    // The log lines, as they come: the test waits for the pruner's refusal, not for a time.
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines_tx.send(l);
        }
    });

    // The retry opens the org here; the replay is the first run's receipt.
    let (status, replayed, again) = post(skewed.url.clone()).await?;
    assert_eq!((status, replayed, &again), (201, true, &receipt));
    let refusal = loop {
        let l = lines
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| "no refusal logged: the pruner ran on a clock 8 days ahead")?;
        assert!(!l.contains("deleted=1"), "pruned: {l}");
        if l.contains("prune refused: nothing deleted") {
            break l;
        }
    };
    assert!(refusal.contains("8days ahead of the store's"), "{refusal}");
    let (status, replayed, again) = post(skewed.url.clone()).await?;
    assert_eq!(
        (status, replayed, &again),
        (201, true, &receipt),
        "{again:?}"
    );
    let metrics = http
        .get(format!("{}/metrics", skewed.url))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with(r#"idem_clock_refusals_total{op="prune"}"#)),
        "{metrics}"
    );
    assert!(skewed.terminate()?.success());
    Ok(())
}
