//! The demo's summary: counts, latency percentiles, handoff gaps and the audit verdict.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::audit::Audit;
use super::client::Stats;
use super::outside::OutsideReads;
use super::{DemoArgs, Handoff};

/// Everything the demo prints.
#[derive(Debug, Serialize)]
pub struct Summary {
    orgs: usize,
    clients: usize,
    requests: usize,
    acknowledged: usize,
    http_sends: u64,
    duplicates_sent: u64,
    replayed: u64,
    conflicts_409: u64,
    mismatches_422: u64,
    unavailable_503: BTreeMap<String, u64>,
    connection_errors: u64,
    ships: u64,
    full_snapshots: u64,
    final_rounds: BTreeMap<String, u64>,
    ack_latency_p50_ms: f64,
    ack_latency_p99_ms: f64,
    handoffs: Vec<Handoff>,
    outside_reads: OutsideReads,
    violations: Vec<String>,
    wall_s: f64,
}

impl Summary {
    /// Builds the summary.
    pub fn new(
        a: &DemoArgs,
        s: &Stats,
        audit: &Audit,
        outside: &OutsideReads,
        handoffs: Vec<Handoff>,
        wall: Duration,
    ) -> Summary {
        let mut lat = s.latencies_ms.clone();
        lat.sort_by(f64::total_cmp);
        let mut violations = s.violations.clone();
        violations.extend(audit.violations.iter().cloned());
        violations.extend(
            outside
                .opened
                .iter()
                .map(|f| format!("an outside process read the served database {f}")),
        );
        if outside.files == 0 {
            violations.push("the outside reader found no served database to read".into());
        }
        if s.acked.len() != a.requests {
            violations.push(format!(
                "{} of {} requests acknowledged",
                s.acked.len(),
                a.requests
            ));
        }
        Summary {
            orgs: a.orgs,
            clients: a.clients,
            requests: a.requests,
            acknowledged: s.acked.len(),
            http_sends: s.sends,
            duplicates_sent: s.duplicates,
            replayed: s.replayed,
            conflicts_409: s.conflicts,
            mismatches_422: s.mismatches,
            unavailable_503: s.unavailable.clone(),
            connection_errors: s.connection_errors,
            ships: audit.ships,
            full_snapshots: audit.full_snapshots,
            final_rounds: audit.rounds.clone(),
            ack_latency_p50_ms: percentile(&lat, 0.50),
            ack_latency_p99_ms: percentile(&lat, 0.99),
            handoffs,
            outside_reads: outside.clone(),
            violations,
            wall_s: wall.as_secs_f64(),
        }
    }

    /// True when no violation was found.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// Prints as text (stdout) or JSON.
    pub fn print(&self, json: bool) {
        if json {
            match serde_json::to_string_pretty(self) {
                Ok(s) => outln!("{s}"),
                Err(e) => errln!("idem: cannot render the summary: {e}"),
            }
            return;
        }
        // How many orgs ended at each round: one line for hundreds of orgs.
        let mut by_round = std::collections::BTreeMap::<u64, usize>::new();
        for round in self.final_rounds.values() {
            *by_round.entry(*round).or_default() += 1;
        }
        let rounds: Vec<String> = by_round
            .iter()
            .map(|(round, orgs)| format!("{orgs} at round {round}"))
            .collect();
        let unavailable: Vec<String> = self
            .unavailable_503
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        outln!();
        outln!(
            "requests       {} over {} orgs by {} clients",
            self.requests,
            self.orgs,
            self.clients
        );
        outln!("acknowledged   {}", self.acknowledged);
        outln!(
            "http sends     {} (duplicates on purpose {}, replayed {}, 409 in flight {}, 422 changed payload {})",
            self.http_sends,
            self.duplicates_sent,
            self.replayed,
            self.conflicts_409,
            self.mismatches_422
        );
        outln!(
            "retried        HTTP 503 answers by reason: {}; connection errors {}",
            if unavailable.is_empty() {
                "none".to_owned()
            } else {
                unavailable.join(", ")
            },
            self.connection_errors
        );
        outln!(
            "ships          {} published ({} full snapshots, the rest deltas); orgs by final round: {}",
            self.ships,
            self.full_snapshots,
            rounds.join(", ")
        );
        outln!(
            "ack latency    p50 {:.1} ms, p99 {:.1} ms (ship-before-ack included)",
            self.ack_latency_p50_ms,
            self.ack_latency_p99_ms
        );
        for h in &self.handoffs {
            outln!(
                "handoff        {} at {:.2}s: per-org gap between acks p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} orgs)",
                h.what,
                h.at_ms / 1000.0,
                h.org_gap_p50_ms,
                h.org_gap_p99_ms,
                h.max_org_gap_ms,
                h.orgs
            );
        }
        outln!(
            "outside reader {} of {} served database files refused to another process (database is locked)",
            self.outside_reads.refused,
            self.outside_reads.files
        );
        if self.ok() {
            outln!(
                "exactly-once   OK: every acknowledged request applied exactly once, balances match, no effect without its key, every snapshot and delta verified"
            );
        } else {
            outln!(
                "exactly-once   FAILED: {} violations",
                self.violations.len()
            );
            for v in self.violations.iter().take(20) {
                outln!("  - {v}");
            }
        }
        outln!("wall time      {:.1} s", self.wall_s);
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Each org's gap across `event`: from its last ack before the event (or the event, for
/// an org first acknowledged after it) to its first ack after it, ms, sorted ascending.
/// Orgs with no ack after the event have no gap.
pub fn org_gaps_ms(acks: &[(usize, Instant)], event: Instant) -> Vec<f64> {
    let mut before: HashMap<usize, Instant> = HashMap::new();
    let mut after: HashMap<usize, Instant> = HashMap::new();
    for (org, t) in acks {
        if *t <= event {
            let e = before.entry(*org).or_insert(*t);
            *e = (*e).max(*t);
        } else {
            let e = after.entry(*org).or_insert(*t);
            *e = (*e).min(*t);
        }
    }
    let mut gaps: Vec<f64> = after
        .iter()
        .map(|(org, t)| {
            let from = before.get(org).copied().unwrap_or(event);
            t.duration_since(from).as_secs_f64() * 1000.0
        })
        .collect();
    gaps.sort_by(f64::total_cmp);
    gaps
}

/// p50, p99 and max of `sorted` (ascending), 0 when empty.
pub fn spread(sorted: &[f64]) -> (f64, f64, f64) {
    (
        percentile(sorted, 0.50),
        percentile(sorted, 0.99),
        sorted.last().copied().unwrap_or(0.0),
    )
}
