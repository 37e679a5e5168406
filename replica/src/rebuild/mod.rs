//! Rebuilding a published position locally: hydrate, resume, the image a chain rebuilds,
//! segments down, deltas applied, SQLite's checks of the image, and its install.

mod apply;
mod at_time;
pub(crate) mod check;
pub(crate) mod download;
pub(crate) mod hydrate;
pub(crate) mod image;
pub(crate) mod install;
pub(crate) mod prefetch;
pub(crate) mod resume;
