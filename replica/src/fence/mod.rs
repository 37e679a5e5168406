//! Fencing: the org's create-only log, the claims that publish into it under a round (I7),
//! and the leases that say which writer is alive (I15).

pub(crate) mod claim;
pub(crate) mod lease;
pub(crate) mod log;
