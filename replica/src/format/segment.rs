//! Segmented snapshots: a full snapshot is a manifest of content-addressed segments (ranges
//! of pages, compressed, named by the sha256 of their pages), and a snapshot names every
//! segment of the previous snapshot whose pages did not change instead of uploading it again.
//! Both directions stream: memory is bounded by the segment size and the transfers in
//! flight, never by the database.
//!
//! Which segments a snapshot may name, and when retention may delete one, is the argument
//! in `docs/design.md` ("Segments and retention"): a snapshot names only segments it uploaded
//! under its own log position, or segments of the newest snapshot its claim knows, which is
//! the newest snapshot in the log for as long as the claim can publish.

pub use super::manifest::{
    MANIFEST_VERSION, MANIFEST_VERSION_SHARED, MAX_MANIFEST_BYTES, MAX_SEGMENT_BYTES, Manifest,
    SegmentRef,
};
