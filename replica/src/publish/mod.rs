//! Publishing: snapshots, deltas and the segments a snapshot uploads.

pub(crate) mod delta;
pub(crate) mod pipeline;
pub(crate) mod ship;
pub(crate) mod snapshot;
pub(crate) mod source;
pub(crate) mod upload;
