//! An org's tenure: from its claim to its end.

mod open;

pub(crate) use open::Opening;
