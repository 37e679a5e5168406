//! `idem clone SRC DST` on the real binary: DST's first snapshot is SRC's state at the
//! position asked for (the newest, a seq or a moment), DST verifies and restores like any
//! org, SRC is unchanged; a DST that already has a log, SRC = DST and an unknown SRC are
//! refused with one line, nothing written.

mod common;

use std::path::Path;

use common::{TestResult, assert_clean_failure, run};
use idem_org::replica::{OrgId, Replica, Settings};
use idem_org::rusqlite::Connection;

/// A store with org `acme` (rows k1, k2, k3, one acknowledged request each), released.
fn seeded_store(dir: &Path) -> TestResult<String> {
    let store = dir.join("store");
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let replica = Replica::open(Replica::local_store(&store)?, "", Settings::default()).await?;
        let registry = idem_org::Registry::builder(dir.join("data"), replica, "seed")
            .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS t (k TEXT)"))
            .build()?;
        let org = registry.acquire(&OrgId::new("acme")?).await?;
        for k in ["k1", "k2", "k3"] {
            org.once(k, move |tx| {
                tx.execute("INSERT INTO t VALUES (?1)", [k])?;
                Ok::<_, idem_org::rusqlite::Error>(k.as_bytes().to_vec())
            })
            .await?;
        }
        registry.shutdown().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    Ok(store.display().to_string())
}

/// The rows of `t` and the applied keys of `org`'s newest published state.
fn rows(store: &str, org: &str, dir: &Path) -> TestResult<(Vec<String>, i64)> {
    let to = dir.join(format!("{org}-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&to);
    let out = run(&[
        "restore",
        org,
        "--store",
        store,
        "--to",
        to.to_str().ok_or("path")?,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let conn = Connection::open(&to)?;
    let mut stmt = conn.prepare("SELECT k FROM t ORDER BY k")?;
    let ks = stmt
        .query_map([], |r| r.get(0))?
        .collect::<Result<Vec<String>, _>>()?;
    let keys = conn.query_row(
        "SELECT count(*) FROM idem_keys WHERE applied = 1",
        [],
        |r| r.get(0),
    )?;
    Ok((ks, keys))
}

#[test]
fn a_clone_is_the_source_at_its_position_and_a_new_org_of_its_own() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let out = run(&["clone", "acme", "beta", "--store", &store, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // By reference, even when every segment holds a page changed since the snapshot.
    let made: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(made["dst"], "beta", "{made}");
    assert!(made["copied"].is_null(), "{made}");
    let acme = rows(&store, "acme", dir.path())?;
    assert_eq!(acme.0, ["k1", "k2", "k3"]);
    assert_eq!(
        rows(&store, "beta", dir.path())?,
        acme,
        "the clone holds the same rows and keys"
    );
    let out = run(&["verify", "beta", "--store", &store]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Its own log: a claim by idem-clone, its snapshot, a release.
    let v: serde_json::Value =
        serde_json::from_slice(&run(&["inspect", "beta", "--store", &store, "--json"]).stdout)?;
    assert_eq!(v["head"], "release", "{v}");
    assert_eq!(v["history"][0]["writer"], "idem-clone", "{v}");

    // At an older position: the state published then, not the newest.
    let snaps: serde_json::Value =
        serde_json::from_slice(&run(&["snapshots", "acme", "--store", &store, "--json"]).stdout)?;
    let first = snaps[0]["seq"].as_u64().ok_or("no seq")?;
    let out = run(&[
        "clone",
        "acme",
        "gamma",
        "--store",
        &store,
        "--at",
        &first.to_string(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // At a snapshot: gamma's snapshot names acme's segments, gamma's folder holds none.
    let made: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert!(made["copied"].is_null(), "{made}");
    assert!(made["shared_segments"].as_u64() >= Some(1), "{made}");
    let segments = |org: &str| -> TestResult<usize> {
        let snap = Path::new(&store).join("orgs").join(org).join("snap");
        Ok(std::fs::read_dir(snap)?
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".seg.zst"))
            .count())
    };
    assert_eq!(segments("gamma")?, 0, "the clone copied segments");
    assert!(segments("acme")? >= 1);
    assert!(
        Path::new(&store).join("orgs/acme/refs/gamma.json").exists(),
        "no clone reference in the source"
    );
    // `idem inspect` of the source names the clone, for an operator about to delete it.
    let v: serde_json::Value =
        serde_json::from_slice(&run(&["inspect", "acme", "--store", &store, "--json"]).stdout)?;
    assert_eq!(v["clones"][0]["org"], "gamma", "{v}");
    assert!(v["clones"][0]["segments"].as_u64() >= Some(1), "{v}");
    let text = run(&["inspect", "acme", "--store", &store]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("clones         gamma"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
    let gamma = rows(&store, "gamma", dir.path())?;
    assert!(
        gamma.0.len() < 3,
        "{gamma:?}: the first position holds fewer rows"
    );
    Ok(())
}

#[test]
fn a_clone_into_an_existing_org_or_itself_or_from_nothing_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    assert!(
        run(&["clone", "acme", "beta", "--store", &store])
            .status
            .success()
    );
    let before = std::fs::read_dir(Path::new(&store).join("orgs/beta/log"))?.count();
    assert_clean_failure(
        &run(&["clone", "acme", "beta", "--store", &store]),
        "already exists",
    );
    assert_eq!(
        std::fs::read_dir(Path::new(&store).join("orgs/beta/log"))?.count(),
        before,
        "a refused clone wrote to the existing org"
    );
    assert_clean_failure(
        &run(&["clone", "acme", "acme", "--store", &store]),
        "into itself",
    );
    assert_clean_failure(
        &run(&["clone", "nobody", "delta", "--store", &store]),
        "not found",
    );
    assert!(!Path::new(&store).join("orgs/delta").exists());
    assert_clean_failure(&run(&["clone", "acme", "../x", "--store", &store]), "org");
    Ok(())
}

/// A clone names its source's segments: the source writing on, publishing new full
/// snapshots and running retention that deletes the snapshot the clone was taken from, and
/// the clone's own retention, leave the clone restoring and verifying its state at the
/// clone (the source keeps what the clone's reference names).
#[test]
fn a_clone_stays_whole_while_its_source_writes_on_and_both_run_retention() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = seeded_store(dir.path())?;
    let out = run(&["clone", "acme", "beta", "--store", &store]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rt = tokio::runtime::Runtime::new()?;
    let deleted = rt.block_on(async {
        let replica = Replica::open(
            Replica::local_store(Path::new(&store))?,
            "",
            Settings::default(),
        )
        .await?;
        let mut settings = idem_org::RegistrySettings::default();
        settings.ship.snapshot_interval_ms = 1;
        let registry =
            idem_org::Registry::builder(dir.path().join("data2"), replica.clone(), "next")
                .settings(settings)
                .on_open(|c| c.execute_batch("CREATE TABLE IF NOT EXISTS t (k TEXT)"))
                .build()?;
        let org = registry.acquire(&OrgId::new("acme")?).await?;
        for k in ["k4", "k5", "k6"] {
            std::thread::sleep(std::time::Duration::from_millis(2));
            org.once(k, move |tx| {
                tx.execute("INSERT INTO t VALUES (?1)", [k])?;
                Ok::<_, idem_org::rusqlite::Error>(k.as_bytes().to_vec())
            })
            .await?;
        }
        registry.shutdown().await;
        let keep_one = idem_org::replica::Retention {
            keep_snapshots: 1,
            keep_ms: 0,
            window_ms: 0,
            level_ms: 0,
        };
        let mut deleted = 0;
        for name in ["acme", "beta"] {
            deleted += replica
                .retain(&OrgId::new(name)?, &keep_one)
                .await?
                .deleted_entries
                .len();
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(deleted)
    })?;
    assert!(deleted > 0, "the source's retention deleted nothing");
    let acme = rows(&store, "acme", dir.path())?;
    assert_eq!(acme.0, ["k1", "k2", "k3", "k4", "k5", "k6"]);
    let beta = rows(&store, "beta", dir.path())?;
    assert_eq!(beta, (vec!["k1".into(), "k2".into(), "k3".into()], 3));
    let out = run(&["verify", "beta", "--store", &store]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
