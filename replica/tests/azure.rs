//! The replica on the Azure Blob API (Azurite): the whole conformance suite (fencing, zombie,
//! fault injection, probe) plus the checks of conditional puts and of the I9 settlement every
//! cloud store runs (`cloud/mod.rs`).
//!
//! Every test here is ignored unless asked for, and fails when no server is configured:
//! `scripts/azure-server -- cargo test -p idem-replica --test azure -- --include-ignored`
//! starts Azurite on loopback, sets `IDEM_AZURE_ENDPOINT` and runs them.

#[macro_use]
mod cloud;

use idem_replica::conformance::{TestStore, azure_store};

mod conformance_on_azure {
    use super::*;
    idem_replica::conformance_tests!(
        TestStore::azure(),
        #[ignore = "needs Azurite: run under scripts/azure-server"]
    );
}

cloud_tests!(
    azure_store(),
    #[ignore = "needs Azurite: run under scripts/azure-server"]
);
