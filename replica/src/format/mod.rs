//! What the store holds, as bytes: log entries, manifests, blob framing, delta bodies,
//! object names and checksums. Nothing here does I/O.

pub(crate) mod blob;
pub(crate) mod body;
pub(crate) mod checksum;
pub(crate) mod clone_ref;
pub(crate) mod entry;
pub(crate) mod journal;
pub(crate) mod layout;
pub mod level;
pub mod manifest;
pub(crate) mod mark;
pub(crate) mod pages;
pub mod segment;
