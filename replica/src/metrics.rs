//! The metrics this crate records through the `metrics` facade (the embedder installs an
//! exporter; `idem serve` serves Prometheus text at `/metrics`).

/// Object store requests, by `op`: `put`, `get`, `head`, `list`, `delete`, `copy`,
/// `multipart` (one per upload started). Counted by [`crate::CountedStore`], which every
/// [`crate::Replica`] wraps its store in.
pub const STORE_REQUESTS: &str = "idem_store_requests_total";
/// Advisory lease renewals written.
pub const LEASE_RENEWALS: &str = "idem_lease_renewals_total";
/// Compressed bytes of snapshots and deltas downloaded (hydrates, restores, verifies).
pub const DOWNLOADED_BYTES: &str = "idem_downloaded_bytes_total";
/// How far this host's clock read from the store's at the last measurement, in seconds
/// (host minus store: positive when the host reads ahead; `Replica::store_time`).
pub const CLOCK_SKEW_SECONDS: &str = "idem_clock_skew_seconds";
/// Decisions by wall-clock age refused because this host's clock and the store's disagreed
/// by more than `Settings::max_clock_skew_ms`, by `op`: `prune`, `retention`.
pub const CLOCK_REFUSALS: &str = "idem_clock_refusals_total";

/// Registers the description and unit of every metric above with the installed recorder.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_counter!(STORE_REQUESTS, "object store requests, by op");
    describe_counter!(LEASE_RENEWALS, "advisory lease renewals written");
    describe_counter!(
        DOWNLOADED_BYTES,
        Unit::Bytes,
        "snapshot and delta bytes downloaded"
    );
    describe_gauge!(
        CLOCK_SKEW_SECONDS,
        Unit::Seconds,
        "this host's clock minus the store's, at the last measurement"
    );
    describe_counter!(
        CLOCK_REFUSALS,
        "decisions by age refused for clock skew, by op"
    );
}
