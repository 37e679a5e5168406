//! `idem effects` and `idem resolve` from the outside (spawned binary).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{TestResult, assert_clean_failure, run, seeded_effects_store};
use idem_org::idem::effect;
use idem_org::replica::{OrgId, Replica, Settings};

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

/// Set in the child: the test binary re-run by the test that names it (`--exact`), playing
/// a payments process that holds org `acme` and hangs in its executor until SIGKILLed.
const CHILD_ENV: &str = "IDEM_TEST_CHILD";
const KEY: &str = "charge-9";

/// The child's role: reserve `charge-9` (1 ms lease) in org `acme` of `$IDEM_EFFECT_STORE`,
/// charge the remote (one line appended to `$IDEM_EFFECT_CHARGES`), print `charged`, then
/// hang in the executor.
fn hold_and_hang() -> TestResult {
    let store = std::env::var("IDEM_EFFECT_STORE")?;
    let charges = std::env::var("IDEM_EFFECT_CHARGES")?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let replica = Replica::open(
            Replica::local_store(Path::new(&store))?,
            "",
            Settings::default(),
        )
        .await?;
        let data = Path::new(&charges).with_extension("data");
        let registry = idem_org::Registry::builder(data, replica, "payments-1").build()?;
        let org = registry.acquire(&OrgId::new("acme")?).await?;
        let out = org
            .effect(
                KEY,
                effect::Options::new().lease_ms(1),
                move || async move {
                    use std::io::Write;
                    let mut log = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&charges)
                        .map_err(effect::Error::ambiguous)?;
                    writeln!(log, "charged {KEY}").map_err(effect::Error::ambiguous)?;
                    log.sync_all().map_err(effect::Error::ambiguous)?;
                    println!("charged");
                    std::future::pending::<()>().await;
                    Ok(b"unreachable".to_vec())
                },
            )
            .await;
        Err::<(), _>(format!("the executor returned: {out:?}").into())
    })
}

/// Runs this test binary as the holder child of test `test`, waits until it has charged,
/// SIGKILLs it, and returns the store path and the charges file.
fn killed_holder(test: &str, dir: &Path) -> TestResult<(String, std::path::PathBuf)> {
    use std::io::BufRead;
    let store = dir.join("store");
    let charges = dir.join("charges.log");
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "holder")
        .env("IDEM_EFFECT_STORE", &store)
        .env("IDEM_EFFECT_CHARGES", &charges)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let charged = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.ends_with("charged"));
    child.kill()?; // SIGKILL mid-executor: nobody settles, nobody calls again
    child.wait()?;
    assert!(charged, "the holder exited before charging");
    Ok((store.display().to_string(), charges))
}

fn charges(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

fn log_entries(store: &str) -> TestResult<usize> {
    let log = Path::new(store).join("orgs").join("acme").join("log");
    Ok(std::fs::read_dir(log)?.count())
}

#[test]
fn a_holder_killed_mid_executor_is_listed_ambiguous_and_resolved_from_the_cli() -> TestResult {
    // Guards (issue 30): after a SIGKILL with nobody calling the key again, `effects --state
    // ambiguous` showed 0 and `resolve` claimed the org, then refused ("it is reserved").
    if std::env::var(CHILD_ENV).is_ok() {
        return hold_and_hang();
    }
    let dir = tempfile::tempdir()?;
    let (store, charged) = killed_holder(
        "a_holder_killed_mid_executor_is_listed_ambiguous_and_resolved_from_the_cli",
        dir.path(),
    )?;
    let ambiguous = effects_json(&store, "ambiguous")?;
    assert_eq!(ambiguous.len(), 1, "{ambiguous:?}");
    let e = &ambiguous[0];
    assert_eq!(
        (&e["key"], &e["stored_state"], &e["lapsed"]),
        (&KEY.into(), &"reserved".into(), &true.into())
    );
    let holder = e["holder"].as_str().ok_or("no holder")?.to_owned();
    assert!(holder.starts_with("payments-1 (instance "), "{holder}");
    assert_eq!(
        e["error"].as_str().unwrap().matches(&holder).count(),
        1,
        "{e}"
    );
    assert!(effects_json(&store, "reserved")?.is_empty());

    // The dead holder's org lease still reads live: refused before any claim, naming it.
    let before = log_entries(&store)?;
    let resolve = |extra: &[&str]| {
        let mut args = vec![
            "resolve",
            "acme",
            KEY,
            "--executed",
            "--result",
            "ch_9",
            "--by",
            "alice",
            "--store",
            &store,
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    let out = resolve(&[]);
    assert_clean_failure(&out, "held by live writer payments-1");
    assert_clean_failure(&out, "nothing claimed");
    assert_eq!(log_entries(&store)?, before, "a refusal claimed the org");
    // The operator knows the host is dead: --force. The resolve then waits one lease term of
    // the reservation (1 ms here) on its own clock, and settles it.
    let out = resolve(&["--force"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["effects", "acme", "--store", &store, "--key", KEY, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let e = &v["effect"];
    assert_eq!(
        (&e["state"], &e["result"], &e["resolved_by"]),
        (&"committed".into(), &"ch_9".into(), &"alice".into())
    );
    assert_eq!(
        e["error"],
        serde_json::Value::Null,
        "a resolved row keeps no old error text"
    );
    let trail: Vec<(String, String)> = e["history"]
        .as_array()
        .ok_or("no history")?
        .iter()
        .map(|t| {
            (
                t["state"].as_str().unwrap().to_owned(),
                t["actor"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        trail,
        [
            ("reserved".to_owned(), holder.clone()),
            ("ambiguous".to_owned(), "alice".to_owned()),
            ("committed".to_owned(), "alice".to_owned()),
        ]
    );
    assert_eq!(charges(&charged), 1, "the remote was charged once");
    Ok(())
}

/// A free loopback port (bound, then released for `idem serve` to take).
fn free_port() -> TestResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[test]
fn a_running_server_resolves_through_its_own_writer_without_being_fenced() -> TestResult {
    // Guards (issue 30): beside a running server `idem resolve` needed --force, which fenced
    // the server's writer for the org; and /metrics did not count a lapsed reservation.
    if std::env::var(CHILD_ENV).is_ok() {
        return hold_and_hang(); // before any runtime: the child builds its own
    }
    let dir = tempfile::tempdir()?;
    let (store, charged) = killed_holder(
        "a_running_server_resolves_through_its_own_writer_without_being_fenced",
        dir.path(),
    )?;
    tokio::runtime::Runtime::new()?.block_on(server_resolves(dir.path(), store, charged))
}

async fn server_resolves(dir: &Path, store: String, charged: std::path::PathBuf) -> TestResult {
    let port = free_port()?;
    let url = format!("http://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let mut child = common::idem()
        .args([
            "serve",
            "--store",
            &store,
            "--listen",
            &listen,
            "--advertise",
            &url,
        ])
        .args(["--force-claim", "--writer", "server-1", "--data"])
        .arg(dir.join("serve-data"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?),
        &mut line,
    )?;
    let _server = common::Server {
        child,
        url: url.clone(),
    };
    assert!(line.starts_with("listening on "), "{line:?}");
    let http = reqwest::Client::new();
    let transfer = |key: &'static str| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let resp = http
                .post(format!("{url}/orgs/acme/transfers"))
                .header("Idempotency-Key", key)
                .json(&serde_json::json!({"from": "a", "to": "b", "cents": 5}))
                .send()
                .await?;
            Ok::<_, reqwest::Error>(resp.status().as_u16())
        }
    };
    // A transfer makes the server acquire acme (its claim fences the dead holder's round).
    assert_eq!(transfer("t-1").await?, 201);
    let gauge = |text: &str, state: &str| -> Option<f64> {
        let name = format!("idem_effects_open{{state=\"{state}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(name.as_str())?.trim().parse().ok())
    };
    // The dead holder's reservation lapses one term (1 ms) after the server's claim, by the
    // server's own clock; /metrics counts it ambiguous.
    let metrics = |http: reqwest::Client, url: String| async move {
        http.get(format!("{url}/metrics"))
            .send()
            .await?
            .text()
            .await
    };
    let text = metrics(http.clone(), url.clone()).await?;
    assert_eq!(gauge(&text, "ambiguous"), Some(1.0), "{text}");
    assert_eq!(gauge(&text, "reserved"), Some(0.0), "{text}");

    // Beside the running server, a store-side resolve is refused before any claim and names
    // the server and its address.
    let before = log_entries(&store)?;
    let resolve = |place: &'static str, value: String| {
        let args = [
            "resolve",
            "acme",
            KEY,
            "--executed",
            "--result",
            "ch_9",
            "--by",
            "bob",
        ];
        tokio::task::spawn_blocking(move || {
            let mut args: Vec<&str> = args.to_vec();
            args.extend([place, value.as_str()]);
            run(&args)
        })
    };
    let out = resolve("--store", store.clone()).await?;
    assert_clean_failure(&out, &format!("--via {url}"));
    assert_eq!(
        log_entries(&store)?,
        before,
        "the refusal claimed (and fenced the server)"
    );
    // Through the server's own writer: nothing claimed, nobody fenced.
    let out = resolve("--via", url.clone()).await?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = metrics(http.clone(), url.clone()).await?;
    assert_eq!(gauge(&text, "ambiguous"), Some(0.0), "{text}");
    // The server still serves acme (it was not fenced): a new transfer is applied.
    assert_eq!(transfer("t-2").await?, 201);
    let store_for_cli = store.clone();
    let committed =
        tokio::task::spawn_blocking(move || effects_json(&store_for_cli, "committed")).await??;
    let row = committed
        .iter()
        .find(|e| e["key"] == KEY)
        .ok_or("not committed in the store")?;
    assert_eq!(
        (&row["result"], &row["resolved_by"]),
        (&"ch_9".into(), &"bob".into())
    );
    // An org this server does not hold: 421, never a claim.
    let resp = http
        .post(format!("{url}/orgs/other/effects/k/resolve"))
        .json(&serde_json::json!({"outcome": "not_executed", "by": "bob"}))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 421);
    let resp = http
        .post(format!("{url}/orgs/acme/effects/{KEY}/resolve"))
        .json(&serde_json::json!({"outcome": "maybe", "by": "bob"}))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 400);
    assert_eq!(charges(&charged), 1);
    Ok(())
}
