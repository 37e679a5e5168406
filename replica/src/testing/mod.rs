//! Test support, behind the `test-util` feature: the conformance suite, fault injection and
//! the latency-shaped store.

pub mod conformance;
pub mod fault;
pub mod latency;
