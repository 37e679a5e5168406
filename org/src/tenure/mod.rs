//! An org's tenure in this process, from its claim to its end: its private state
//! ([`state`]), the shipper lock that is the only way to its claim and chain
//! ([`publishing`]), the start — claim, resume or hydrate, open ([`open`]) — and the end:
//! one table of every way an org ends ([`end`]), which a graceful release ([`release`]),
//! the shipper task, a park and an unpark all report to.
//!
//! ```text
//! claim ─► resume the kept file | hydrate ─► open the writer ─► serve (ship, park, unpark)
//!                                                                 │
//!   poisoned · claim lost · released · abandoned  ─►  end(reason) ┘
//!     release the claim or not, stop, close the writer, keep or discard the files
//! ```

pub(crate) mod end;
pub(crate) mod open;
pub(crate) mod publishing;
mod release;
pub(crate) mod state;
