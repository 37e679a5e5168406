//! The demo's summary: counts, latency percentiles, handoff gaps and the audit verdict.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::audit::Audit;
use super::client::{AckTime, Stats};
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
        let mut lat: Vec<f64> = s.ack_times.iter().map(AckTime::latency_ms).collect();
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
            outln!(
                "               of which the handoff's own wait per org (its requests in flight then and its first after, send to ack): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
                h.org_wait_p50_ms,
                h.org_wait_p99_ms,
                h.max_org_wait_ms
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
pub fn org_gaps_ms(acks: &[AckTime], event: Instant) -> Vec<f64> {
    let mut before: HashMap<usize, Instant> = HashMap::new();
    let mut after: HashMap<usize, Instant> = HashMap::new();
    for a in acks {
        let t = a.acked;
        if t <= event {
            let e = before.entry(a.org).or_insert(t);
            *e = (*e).max(t);
        } else {
            let e = after.entry(a.org).or_insert(t);
            *e = (*e).min(t);
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

impl AckTime {
    /// First send to first ack, ms, retries included.
    fn latency_ms(&self) -> f64 {
        self.acked.duration_since(self.sent).as_secs_f64() * 1000.0
    }
}

/// Each org's wait on `event`, ms, sorted ascending: the longest first-send-to-ack time
/// among its requests in flight at the event and the first one it sent after it.
///
/// This is the part of the org's gap across the event (`org_gaps_ms`) spent waiting on a
/// request, the event's delay plus one ordinary ack: the rest of that gap is the time until
/// the org's clients sent it a request at all, which depends on how often they send, not
/// on the handoff. Orgs with no ack after
/// the event have no wait, so both lists have the same length.
pub fn org_waits_ms(acks: &[AckTime], event: Instant) -> Vec<f64> {
    let mut first_after: HashMap<usize, Instant> = HashMap::new();
    for a in acks.iter().filter(|a| a.sent > event) {
        let e = first_after.entry(a.org).or_insert(a.sent);
        *e = (*e).min(a.sent);
    }
    let mut wait: HashMap<usize, f64> = HashMap::new();
    for a in acks {
        let in_flight = a.sent <= event && a.acked > event;
        if in_flight || first_after.get(&a.org) == Some(&a.sent) {
            let ms = a.latency_ms();
            let e = wait.entry(a.org).or_insert(ms);
            *e = e.max(ms);
        }
    }
    let mut waits: Vec<f64> = wait.into_values().collect();
    waits.sort_by(f64::total_cmp);
    waits
}

/// p50, p99 and max of `sorted` (ascending), 0 when empty.
pub fn spread(sorted: &[f64]) -> (f64, f64, f64) {
    (
        percentile(sorted, 0.50),
        percentile(sorted, 0.99),
        sorted.last().copied().unwrap_or(0.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(org: usize, t0: Instant, sent_ms: u64, acked_ms: u64) -> AckTime {
        AckTime {
            org,
            sent: t0 + Duration::from_millis(sent_ms),
            acked: t0 + Duration::from_millis(acked_ms),
        }
    }

    /// The wait counts a request in flight at the event and the org's first one after it,
    /// not the time before a client sent anything, nor later requests.
    #[test]
    fn an_orgs_wait_is_its_in_flight_and_first_later_requests_not_its_spacing() {
        let t0 = Instant::now();
        let event = t0 + Duration::from_millis(1_000);
        let acks = [
            // org 0: acked before, in flight across the event for 700 ms, then one sent
            // 2 s after the event that waited 50 ms, then a slow one that is not its first.
            ack(0, t0, 100, 120),
            ack(0, t0, 900, 1_600),
            ack(0, t0, 3_000, 3_050),
            ack(0, t0, 3_100, 9_000),
            // org 1: nothing in flight; its first request after the event waited 400 ms
            // after a quiet 3 s.
            ack(1, t0, 500, 510),
            ack(1, t0, 4_000, 4_400),
            // org 2: only before the event: no gap, no wait.
            ack(2, t0, 200, 230),
        ];
        assert_eq!(org_waits_ms(&acks, event), vec![400.0, 700.0]);
        // Its gaps are the spacing plus the wait: 1,600 - 120 and 4,400 - 510.
        assert_eq!(org_gaps_ms(&acks, event), vec![1_480.0, 3_890.0]);
    }
}
