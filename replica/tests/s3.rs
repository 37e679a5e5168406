//! The replica on a real S3 API: the whole conformance suite (fencing, zombie, fault
//! injection, probe) plus the checks of conditional puts and of the I9 settlement every cloud
//! store runs (`cloud/mod.rs`).
//!
//! Every test here is ignored unless asked for, and fails when no server is configured:
//! `scripts/s3-server -- cargo test -p idem-replica -- --include-ignored` starts moto's S3
//! server on loopback, sets `IDEM_S3_ENDPOINT` and runs them.

#[macro_use]
mod cloud;

use idem_replica::conformance::{TestStore, s3_store};

mod conformance_on_s3 {
    use super::*;
    idem_replica::conformance_tests!(
        TestStore::s3(),
        #[ignore = "needs a loopback S3 server: run under scripts/s3-server"]
    );
}

cloud_tests!(
    s3_store(),
    #[ignore = "needs a loopback S3 server: run under scripts/s3-server"]
);
