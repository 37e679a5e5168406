//! The demo's exactly-once audit, from the store's newest published states only.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use idem_org::replica::{LogEntry, OrgId, Replica};
use idem_org::{idem, rusqlite};

use super::client::Request;
use crate::ledger::Receipt;

/// What the audit found.
#[derive(Debug, Default)]
pub struct Audit {
    /// Snapshots and deltas published and still in the log (all orgs).
    pub ships: u64,
    /// Full snapshots among `ships` (the rest are deltas).
    pub full_snapshots: u64,
    /// Highest round per org.
    pub rounds: BTreeMap<String, u64>,
    /// Violations; empty means exactly-once held.
    pub violations: Vec<String>,
}

/// Restores every org's newest snapshot and checks, against the acknowledged requests:
/// each is applied exactly once with its payload (its key row and one matching effect row),
/// no effect exists without its key (nor a key without its effect), nothing unacknowledged
/// was applied, balances equal the sum of acknowledged transfers, and every snapshot passes
/// its checksum and SQLite integrity check.
pub async fn audit(replica: &Replica, orgs: &[String], acked: &[(Request, Vec<u8>)]) -> Audit {
    let mut a = Audit::default();
    for (i, name) in orgs.iter().enumerate() {
        let mine: Vec<&(Request, Vec<u8>)> = acked.iter().filter(|(r, _)| r.org == i).collect();
        if let Err(e) = audit_org(replica, name, &mine, &mut a).await {
            a.violations.push(format!("org {name}: {e}"));
        }
    }
    a
}

async fn audit_org(
    replica: &Replica,
    name: &str,
    acked: &[&(Request, Vec<u8>)],
    a: &mut Audit,
) -> Result<(), String> {
    let org = OrgId::new(name).map_err(|e| e.to_string())?;
    // A journal org's log holds format-5 claims and checkpoints: read with the journal's
    // reader; its restore below (base links and section digests, I10) is its verification.
    let (history, journal) = match replica.history(&org).await {
        Ok(h) => (h, false),
        Err(idem_org::replica::Error::JournalRequired { .. }) => (
            replica
                .journal_history(&org)
                .await
                .map_err(|e| crate::chain(&e))?,
            true,
        ),
        Err(e) => return Err(crate::chain(&e)),
    };
    a.ships += history.iter().filter(|e| e.stored().is_some()).count() as u64;
    a.full_snapshots += history.iter().filter(|e| e.is_snapshot()).count() as u64;
    a.rounds.insert(
        name.to_owned(),
        history.iter().map(LogEntry::round).max().unwrap_or(0),
    );
    if !journal {
        let report = replica.verify(&org).await.map_err(|e| crate::chain(&e))?;
        for (seq, e) in &report.failed {
            a.violations.push(format!(
                "org {name}: seq {seq} failed verification: {}",
                crate::chain(e)
            ));
        }
    }
    let Some(restored) = crate::store::restored::restore(replica, &org, None).await? else {
        if !acked.is_empty() {
            a.violations.push(format!(
                "org {name}: {} acknowledged requests but no snapshot",
                acked.len()
            ));
        }
        return Ok(());
    };
    let conn = restored.open()?;
    let q = |e: rusqlite::Error| format!("reading the snapshot: {e}");
    let mut effects: HashMap<String, (String, String, i64)> = HashMap::new();
    let mut stmt = conn
        .prepare("SELECT key, src, dst, cents FROM transfers")
        .map_err(q)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?))))
        .map_err(q)?;
    for row in rows {
        let (k, v) = row.map_err(q)?;
        effects.insert(k, v);
    }
    // Keys are read through idem's public API (the dedup table is idem's own): a key row is
    // an applied record, and the count of applied keys catches a key without its effect.
    let applied = |key: &str| -> Result<bool, String> {
        idem::applied(&conn, key)
            .map(|r| r.is_some_and(|r| r.is_applied()))
            .map_err(|e| format!("reading the snapshot: {}", crate::chain(&e)))
    };
    let applied_keys = idem::stats(&conn)
        .map_err(|e| format!("reading the snapshot: {}", crate::chain(&e)))?
        .applied_keys;
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    let mut acked_keys = BTreeSet::new();
    for (r, body) in acked {
        acked_keys.insert(r.key.clone());
        let t = &r.transfer;
        *expected.entry(t.from.clone()).or_default() -= t.cents;
        *expected.entry(t.to.clone()).or_default() += t.cents;
        match effects.get(&r.key) {
            None => a
                .violations
                .push(format!("org {name}: acknowledged {} has no effect", r.key)),
            Some((s, d, c)) if (s, d, *c) != (&t.from, &t.to, t.cents) => a.violations.push(
                format!("org {name}: effect of {} differs from its request", r.key),
            ),
            Some(_) => {}
        }
        if !applied(&r.key)? {
            a.violations
                .push(format!("org {name}: acknowledged {} has no key row", r.key));
        }
        match serde_json::from_slice::<Receipt>(body) {
            Ok(rc) if rc.key == r.key && rc.transfer == *t => {}
            _ => a
                .violations
                .push(format!("org {name}: receipt of {} does not match", r.key)),
        }
    }
    let mut effects_with_keys = 0u64;
    for k in effects.keys() {
        if applied(k)? {
            effects_with_keys += 1;
        } else {
            a.violations
                .push(format!("org {name}: effect {k} exists without its key"));
        }
        if !acked_keys.contains(k) {
            a.violations
                .push(format!("org {name}: effect {k} was never acknowledged"));
        }
    }
    if applied_keys > effects_with_keys {
        a.violations.push(format!(
            "org {name}: {} keys applied without their effect",
            applied_keys - effects_with_keys
        ));
    }
    let actual: BTreeMap<String, i64> = crate::ledger::balances(&conn)
        .map_err(q)?
        .into_iter()
        .collect();
    if actual != expected {
        a.violations.push(format!(
            "org {name}: balances {actual:?} differ from acknowledged transfers {expected:?}"
        ));
    }
    if actual.values().sum::<i64>() != 0 {
        a.violations
            .push(format!("org {name}: balances do not sum to zero"));
    }
    Ok(())
}
