//! Plain settings (serde-able) and the injected clock.

use serde::{Deserialize, Serialize};

/// Largest allowed [`Settings::inline_delta_bytes`]: 1 MiB, so a log entry (base64 adds a
/// third) stays small enough to read whole whenever the log is read.
pub const MAX_INLINE_DELTA_BYTES: usize = 1024 * 1024;

/// Shortest allowed [`Settings::lease_ms`]: 1 s. Renewals go out every third of a term, so a
/// shorter one is a few hundred ms per PUT round trip, which a store under load does not
/// keep, and a holder would lose its orgs while alive.
pub const MIN_LEASE_MS: u64 = 1_000;

/// Longest holder's term a claimant honours unless its own is longer: an hour
/// ([`max_holder_term_ms`]).
pub const MAX_HOLDER_TERM_MS: u64 = 60 * 60 * 1_000;

/// The longest term, in ms, a claimant whose own lease is `own_lease_ms` takes from a lease
/// (the `term_ms` its holder wrote) before it watches: ten of its own terms or an hour,
/// whichever is longer. The term comes from an object any writer to the store can craft, so
/// without a bound one lease could block an org forever; a genuine holder configured longer
/// than the bound (a tenfold mismatch of settings past an hour) is taken for dead after the
/// bound of silence, which fencing keeps safe (I7).
pub fn max_holder_term_ms(own_lease_ms: u64) -> u64 {
    own_lease_ms.saturating_mul(10).max(MAX_HOLDER_TERM_MS)
}

/// Tunables of a [`crate::Replica`]. Plain data: `Default`, serde.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Advisory lease length in ms: this process's lease is renewed by a timer every
    /// `lease_ms / 3` (360 PUTs an hour at the default 30 000, whatever the number of orgs),
    /// and a claimant takes this process's orgs only once it has seen that lease unchanged
    /// for this `lease_ms` (written into the lease) plus a tenth on its own monotonic clock
    /// (I15). At least [`MIN_LEASE_MS`].
    pub lease_ms: u64,
    /// How many times `claim` re-reads the log and retries after losing a race.
    pub claim_retries: u32,
    /// zstd compression level for snapshot blobs (1–22; 3 is zstd's default).
    pub zstd_level: i32,
    /// How many log entries are fetched concurrently when reading history.
    pub read_concurrency: usize,
    /// How many journal batch headers one listing of a run reads concurrently (each a small
    /// GET, `docs/design.md` 3g). A takeover's first listing reads every header from the
    /// oldest entry among the holder's orgs, hundreds of them, and every walk waiting on it
    /// waits for all: at 16 a run of 400 batches took 25 sequential round trips (700 ms
    /// on S3's latency, P10). At least 1; default 128.
    pub header_concurrency: usize,
    /// Where clients reach this process (for example `http://10.0.0.7:8080`), written into
    /// the leases it holds: a replica refused by one of them names it to its client, which
    /// retries there instead of waiting. `None`: not advertised.
    #[serde(default)]
    pub advertise: Option<String>,
    /// Largest packed delta (the `idemsnap` header + zstd frame, in bytes) carried inside its
    /// log entry instead of a blob object: such a ship costs one create-only PUT instead of
    /// two, and a hydrate one GET less per delta. 0 = every delta gets a blob. Full
    /// snapshots always get a blob. Default 256 KiB (an entry of at most about 350 KB with
    /// base64): on S3 a PUT of that size takes about as long as an empty one, so a blob
    /// would add a whole sequential round trip to the ack (`docs/design.md` 2a). A claim
    /// reads up to 16 of the newest entries whole, so this bounds its memory at about 22
    /// times the setting (5.6 MB at the default).
    pub inline_delta_bytes: usize,
    /// How many pipelined ships a claim may keep in flight (`docs/design.md` 3e), 1 to
    /// [`crate::MAX_SHIP_WINDOW`]. Above 1 every entry of a claim is written in format
    /// version 4, which versions before it refuse: raise it only once every process that
    /// opens the store runs this version. Default 1 (one ship at a time, as before).
    pub ship_window: u64,
    /// Log entries a handle keeps (across orgs, inline bodies dropped: a few hundred bytes
    /// each) so retention reads only entries it has not seen: the ones this handle published
    /// are never read back. When full, it forgets everything and starts over. 0 = keep none
    /// (every retention run reads the whole log). Default 65536.
    pub known_entries: usize,
    /// Uncompressed bytes of pages per segment of a full snapshot (rounded down to whole
    /// pages; at least one page, at most [`crate::segment::MAX_SEGMENT_BYTES`]): a snapshot
    /// uploads only the segments whose pages changed since the previous one. Smaller segments
    /// upload fewer unchanged pages around each change but cost more PUTs and a longer
    /// manifest; `docs/design.md` gives the measurements behind the default, 256 KiB.
    pub segment_bytes: usize,
    /// Segment uploads in flight during a full snapshot (memory: about twice
    /// `segment_bytes` per upload). Default 8.
    pub upload_concurrency: usize,
    /// Largest disagreement, in ms, between this host's clock and the store's (read from the
    /// Last-Modified of an object this process wrote) at which a decision by wall-clock age
    /// still runs: key prune and snapshot retention are refused beyond it (I15,
    /// [`crate::Replica::store_time`]). Default 300 000 (5 minutes): NTP keeps hosts within
    /// milliseconds, S3 refuses requests signed more than 15 minutes off, and retention
    /// windows are hours or days. At least 1.
    pub max_clock_skew_ms: u64,
    /// Closed chains this handle compacts into level files at once, across every org
    /// ([`crate::Replica::compact_levels`]): each holds a temp image on disk and at most
    /// [`crate::MAX_LEVEL_BYTES`] of sections in memory. At least 1; default 2.
    pub compaction_concurrency: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lease_ms: 30_000,
            claim_retries: 8,
            zstd_level: 3,
            read_concurrency: 16,
            header_concurrency: 128,
            advertise: None,
            inline_delta_bytes: 256 * 1024,
            ship_window: 1,
            known_entries: 65_536,
            segment_bytes: 256 << 10,
            upload_concurrency: 8,
            max_clock_skew_ms: 300_000,
            compaction_concurrency: 2,
        }
    }
}

impl Settings {
    pub(crate) fn check(&self) -> Result<(), crate::Error> {
        let bad = |reason: String| Err(crate::Error::InvalidSettings { reason });
        if self.lease_ms < MIN_LEASE_MS {
            return bad(format!(
                "lease_ms {} is below {MIN_LEASE_MS} ms",
                self.lease_ms
            ));
        }
        if !(1..=22).contains(&self.zstd_level) {
            return bad(format!("zstd_level {} is outside 1..=22", self.zstd_level));
        }
        if self.read_concurrency == 0 {
            return bad("read_concurrency must be at least 1".into());
        }
        if self.header_concurrency == 0 {
            return bad("header_concurrency must be at least 1".into());
        }
        if self.segment_bytes == 0 || self.segment_bytes as u64 > crate::segment::MAX_SEGMENT_BYTES
        {
            return bad(format!(
                "segment_bytes {} is outside 1..={}",
                self.segment_bytes,
                crate::segment::MAX_SEGMENT_BYTES
            ));
        }
        if self.max_clock_skew_ms == 0 {
            return bad("max_clock_skew_ms must be at least 1".into());
        }
        if self.compaction_concurrency == 0 {
            return bad("compaction_concurrency must be at least 1".into());
        }
        if self.upload_concurrency == 0 {
            return bad("upload_concurrency must be at least 1".into());
        }
        if !(1..=crate::MAX_SHIP_WINDOW).contains(&self.ship_window) {
            return bad(format!(
                "ship_window {} is outside 1..={}",
                self.ship_window,
                crate::MAX_SHIP_WINDOW
            ));
        }
        if self.inline_delta_bytes > MAX_INLINE_DELTA_BYTES {
            return bad(format!(
                "inline_delta_bytes {} is above {MAX_INLINE_DELTA_BYTES}",
                self.inline_delta_bytes
            ));
        }
        Ok(())
    }
}

/// The default point-in-time window: 30 days, in ms.
pub const DEFAULT_WINDOW_MS: u64 = 30 * 24 * 3_600_000;

/// Retention policy for [`crate::Replica::retain`] and the point-in-time window's levels
/// ([`crate::Replica::compact_levels`], `docs/design.md` 2d).
///
/// Three levels of positions: every acknowledged position (a delta entry) for at least
/// `keep_ms`; one position per `level_ms` bucket (a level file's section) for the window;
/// every snapshot for the window. A snapshot is deleted only if it is beyond the newest
/// `keep_snapshots` AND older than the window (`window_ms`, or `keep_ms` if that is
/// longer); the newest snapshot is always kept whatever the policy says (I11).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Retention {
    /// Newest snapshots to keep (values below 1 are treated as 1).
    pub keep_snapshots: usize,
    /// How long every acknowledged position stays restorable, ms: the deltas of a closed
    /// chain are deleted once its newest delta is this old and its level file exists.
    /// Default one hour.
    pub keep_ms: u64,
    /// The point-in-time window, ms: snapshots and level files younger than this stay, so
    /// any moment inside it restores to its bucket's last position. Default 30 days
    /// ([`DEFAULT_WINDOW_MS`]); 0 keeps the window at `keep_ms`.
    pub window_ms: u64,
    /// Width of a level file's buckets, ms: a moment older than `keep_ms` restores to the
    /// last position of its bucket. Default 60 000 (a minute); 0 turns level files off (a
    /// closed chain's deltas then stay for the whole window).
    pub level_ms: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            keep_snapshots: 3,
            keep_ms: 3_600_000,
            window_ms: DEFAULT_WINDOW_MS,
            level_ms: 60_000,
        }
    }
}

impl Retention {
    /// The minimum age in ms before a snapshot (and its level file) may be deleted: the
    /// window, or `keep_ms` when that is longer.
    pub fn snapshot_age_ms(&self) -> u64 {
        self.window_ms.max(self.keep_ms)
    }
}
