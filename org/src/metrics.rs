//! The metrics this crate records, through the `metrics` facade: the embedder installs the
//! exporter it wants (`idem serve` installs Prometheus and serves `/metrics`); without one,
//! recording costs a few atomic loads. Names follow Prometheus conventions: `idem_` prefix,
//! `_total` counters, `_seconds` and `_bytes` units.

use std::time::Duration;

/// Requests answered by the HTTP layer, by `outcome`: `applied`, `replayed`, `input` (400),
/// `in_flight` (409), `mismatch` (422), `rejected` (409), `refused` (the handler's own
/// answer, not stored), `fenced` (503: a newer round holds the org), `unavailable` (other
/// 503s: retry or re-acquire), `error` (500).
pub const REQUESTS: &str = "idem_requests_total";
/// Seconds from a request reaching its org to its acknowledgement, by `outcome`: `applied`
/// (waited for the ship holding its commit) or `replayed` (waited for a confirmation).
pub const ACK_SECONDS: &str = "idem_ack_seconds";
/// Seconds one ship took (capture, upload, publish), by `kind`: `full`, `delta`, `compacted`.
pub const SHIP_SECONDS: &str = "idem_ship_seconds";
/// Ships published, by `kind`.
pub const SHIPS: &str = "idem_ships_total";
/// Compressed bytes uploaded by ships (blobs; log entries not counted).
pub const SHIPPED_BYTES: &str = "idem_shipped_bytes_total";
/// Ships and confirmations that failed and left their waiters unacknowledged (retryable).
pub const SHIP_FAILURES: &str = "idem_ship_failures_total";
/// Writers that stopped, by `reason`: `fenced` (a newer round claimed the org),
/// `claim_lost` (a publish of unknown outcome) or `poisoned` (its files were changed from
/// outside, I13).
pub const WRITERS_STOPPED: &str = "idem_writers_stopped_total";
/// Seconds to claim and hydrate an org before it serves.
pub const HYDRATE_SECONDS: &str = "idem_hydrate_seconds";
/// Acquires that reused the database file this host kept at a release (the store proved it
/// current), downloading nothing.
pub const RESUMES: &str = "idem_resumes_total";
/// Orgs open (served) in this process.
pub const OPEN_ORGS: &str = "idem_open_orgs";
/// Idle orgs parked: connection and descriptors closed, claim kept (docs/design.md, 3c).
pub const PARKS: &str = "idem_parks_total";
/// Parked orgs reopened for a request, their file proven to be the chain's tip.
pub const UNPARKS: &str = "idem_unparks_total";
/// Retention deletions after ships, by `what`: `entries` or `blobs`.
pub const RETENTION_DELETED: &str = "idem_retention_deleted_total";
/// Counter: level files written by background compaction (`docs/design.md` 2d).
pub const LEVEL_FILES_WRITTEN: &str = "idem_level_files_written_total";
/// External effects settled, by `state`: `committed`, `failed` (proved not executed),
/// `ambiguous` (outcome unknown: needs `resolve`).
pub const EFFECTS: &str = "idem_effects_total";
/// External effects open now in the orgs this process serves, by `state`: `reserved` (in
/// progress) and `ambiguous` (needs `resolve`; a reservation whose lease lapsed counts here),
/// set at each scrape by `Registry::record_effect_gauges`.
pub const EFFECTS_OPEN: &str = "idem_effects_open";

/// Registers the description and unit of every metric above, and of `idem_replica`'s
/// (store requests by op, lease renewals, bytes downloaded), with the installed recorder.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    idem_replica::metrics::describe();
    describe_counter!(REQUESTS, "HTTP requests answered, by outcome");
    describe_histogram!(ACK_SECONDS, Unit::Seconds, "request to acknowledgement");
    describe_histogram!(
        SHIP_SECONDS,
        Unit::Seconds,
        "one ship: capture, upload, publish"
    );
    describe_counter!(SHIPS, "ships published, by kind");
    describe_counter!(
        SHIPPED_BYTES,
        Unit::Bytes,
        "compressed bytes uploaded by ships"
    );
    describe_counter!(SHIP_FAILURES, "ships and confirmations that failed");
    describe_counter!(WRITERS_STOPPED, "writers stopped, by reason");
    describe_histogram!(
        HYDRATE_SECONDS,
        Unit::Seconds,
        "claim and hydrate before serving"
    );
    describe_counter!(RESUMES, "acquires that reused the file kept at a release");
    describe_gauge!(OPEN_ORGS, "orgs served by this process");
    describe_counter!(PARKS, "idle orgs parked (connection closed, claim kept)");
    describe_counter!(UNPARKS, "parked orgs reopened, their file proven");
    describe_counter!(RETENTION_DELETED, "retention deletions, by what");
    describe_counter!(
        LEVEL_FILES_WRITTEN,
        "level files of closed chains written by background compaction"
    );
    describe_counter!(EFFECTS, "external effects settled, by state");
    describe_gauge!(EFFECTS_OPEN, "external effects open now, by state");
}

/// A short, stable tag of an idempotency key for logs and spans (keys may carry customer
/// data, so spans name a hash, not the key): 16 hex digits of FNV-1a.
pub fn key_hash(key: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Counts one request answered by `outcome` (see [`REQUESTS`]): for an application's own
/// answers around the HTTP layer (a bad org id in its path, a body it refuses before the
/// layer), so the metric covers every request.
pub fn record_request(outcome: &'static str) {
    metrics::counter!(REQUESTS, "outcome" => outcome).increment(1);
}

pub(crate) fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}
