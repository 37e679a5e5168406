//! Test support, behind the `test-util` feature: the conformance suite and fault injection.

pub mod conformance;
pub mod fault;
