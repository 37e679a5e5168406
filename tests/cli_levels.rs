//! The point-in-time window on the real binary (`docs/design.md` 2d): after compaction and
//! retention thinned a closed chain, `idem snapshots` lists its level-file sections as
//! positions of kind `level`, `idem restore --at` a section gives the same file it gave
//! before thinning, `--at-time` a moment inside the chain restores its minute's last
//! position, and a thinned-out position fails with one line naming the kept ones around it.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use common::{TestResult, assert_clean_failure, run};
use idem_org::replica::{
    Clock, Delta, ManualClock, OrgId, Replica, Retention, Settings, Snapshot, SystemClock,
};
use idem_org::rusqlite::{Connection, MAIN_DB};

const MINUTE: u64 = 60_000;

/// The pages of `next` that differ from `prev` (4 KiB pages).
fn diff(prev: &[u8], next: &[u8], commit: u64) -> TestResult<Delta> {
    let mut pages = BTreeMap::new();
    for (i, page) in next.chunks(4096).enumerate() {
        if prev.get(i * 4096..(i + 1) * 4096) != Some(page) {
            pages.insert(i as u32 + 1, page.to_vec());
        }
    }
    Ok(Delta::new(4096, (next.len() / 4096) as u32, pages, commit)?)
}

/// A store whose org `acme` has one closed chain of 12 deltas, 25 s apart, two hours ago,
/// compacted and thinned; returns the store and every delta's (seq, at_ms).
fn thinned_store(dir: &Path) -> TestResult<(String, Vec<(u64, u64)>)> {
    let store = dir.join("store");
    let rt = tokio::runtime::Runtime::new()?;
    let deltas = rt.block_on(async {
        let clock = Arc::new(ManualClock::new(SystemClock.now_ms() - 3 * 60 * MINUTE));
        let objects = Replica::local_store(&store)?;
        let replica =
            Replica::open_with(objects, "", Settings::default(), clock.clone(), None).await?;
        let org = OrgId::new("acme")?;
        let mut claim = replica.claim(&org, "seed", false).await?;
        let mut conn = Connection::open_in_memory()?;
        conn.execute_batch("PRAGMA page_size = 4096; CREATE TABLE t (k INTEGER)")?;
        let mut prev = conn.serialize(MAIN_DB)?.to_vec();
        replica
            .ship(&mut claim, Snapshot::from_bytes(prev.clone(), 1))
            .await?;
        let mut deltas = Vec::new();
        for k in 0..12u64 {
            clock.advance(25_000);
            conn.execute("INSERT INTO t VALUES (?1)", [k as i64])?;
            let next = conn.serialize(MAIN_DB)?.to_vec();
            let shipped = replica
                .ship_delta(&mut claim, diff(&prev, &next, k + 2)?)
                .await?;
            deltas.push((shipped.seq, clock.now_ms()));
            prev = next;
        }
        clock.advance(MINUTE);
        replica
            .ship(&mut claim, Snapshot::from_bytes(prev.clone(), 14))
            .await?;
        replica.release(&mut claim).await?;
        let policy = Retention::default();
        replica.compact_levels(&org, &policy).await?;
        clock.advance(SystemClock.now_ms().saturating_sub(clock.now_ms()));
        let report = replica.retain(&org, &policy).await?;
        assert_eq!(report.deleted_entries.len(), 12, "{report:?}");
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(deltas)
    })?;
    Ok((store.display().to_string(), deltas))
}

/// The rows of `t` in a restored file.
fn rows(path: &Path) -> TestResult<Vec<i64>> {
    let conn = Connection::open(path)?;
    let mut stmt = conn.prepare("SELECT k FROM t ORDER BY k")?;
    let got = stmt.query_map([], |r| r.get(0))?;
    Ok(got.collect::<Result<_, _>>()?)
}

#[test]
fn thinned_positions_list_as_levels_and_restore_by_seq_and_by_moment() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (store, deltas) = thinned_store(dir.path())?;
    let out = run(&["snapshots", "acme", "--store", &store, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let levels: Vec<u64> = listed
        .as_array()
        .ok_or("not an array")?
        .iter()
        .filter(|p| p["kind"] == "level")
        .filter_map(|p| p["seq"].as_u64())
        .collect();
    // One section per minute that saw a delta: its last delta.
    let mut want = Vec::new();
    for (i, (seq, at)) in deltas.iter().enumerate() {
        if deltas
            .get(i + 1)
            .is_none_or(|(_, next)| next / MINUTE != at / MINUTE)
        {
            want.push(*seq);
        }
    }
    assert_eq!(levels, want);
    let text = run(&["snapshots", "acme", "--store", &store]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("level"));

    for (i, (seq, at)) in deltas.iter().enumerate() {
        let to = dir.path().join(format!("at-{seq}.db"));
        let to_s = to.display().to_string();
        let seq_s = seq.to_string();
        let out = run(&[
            "restore", "acme", "--store", &store, "--to", &to_s, "--at", &seq_s,
        ]);
        if want.contains(seq) {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            // Delta i inserted k = 0..=i.
            assert_eq!(rows(&to)?, (0..=i as i64).collect::<Vec<_>>());
            // The moment of this position restores it too.
            let moment = chrono_free_rfc3339(*at);
            let to2 = dir.path().join(format!("moment-{seq}.db"));
            let to2_s = to2.display().to_string();
            let out = run(&[
                "restore",
                "acme",
                "--store",
                &store,
                "--to",
                &to2_s,
                "--at-time",
                &moment,
            ]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(std::fs::read(&to2)?, std::fs::read(&to)?);
        } else {
            assert_clean_failure(&out, "is not kept");
            assert!(!to.exists());
        }
    }
    Ok(())
}

/// `ms` as RFC 3339 with milliseconds, UTC (humantime formats it).
fn chrono_free_rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}
