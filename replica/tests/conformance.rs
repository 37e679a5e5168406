//! The conformance suite on every store that needs no server: `InMemory`, `LocalFileSystem`
//! in a temp directory, and `InMemory` behind the fault-injecting wrapper. (S3: `s3.rs`.)

use idem_replica::conformance::TestStore;

mod in_memory {
    use super::*;
    idem_replica::conformance_tests!(TestStore::memory());
}

mod local_dir {
    use super::*;
    idem_replica::conformance_tests!(TestStore::local());
}

mod fault_injecting {
    use super::*;
    idem_replica::conformance_tests!(TestStore::faulty(TestStore::memory()));
}
