//! Helpers shared by the replica integration tests (included with `mod common;`): a replica
//! on an in-memory store, the store's objects, journal builders ([`journal`]) and a store
//! that forces a schedule at exact requests ([`interpose`]).
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;

use futures::TryStreamExt;
use idem_replica::{OrgId, Replica, Settings};
use object_store::ObjectStore;
use object_store::memory::InMemory;

pub mod interpose;
pub mod journal;

/// What a test returns.
pub type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// An empty in-memory store.
pub fn memory() -> Arc<dyn ObjectStore> {
    Arc::new(InMemory::new())
}

/// A replica on `store` at the root, with the default settings.
pub async fn open(store: Arc<dyn ObjectStore>) -> Replica {
    Replica::open(store, "", Settings::default()).await.unwrap()
}

/// The org named `s`.
pub fn org(s: &str) -> OrgId {
    OrgId::new(s).unwrap()
}

/// Every object under the store, with its size, sorted: what "deleted nothing" compares.
pub async fn objects(store: &Arc<dyn ObjectStore>) -> Vec<(String, u64)> {
    let mut all: Vec<(String, u64)> = store
        .list(None)
        .map_ok(|m| (m.location.to_string(), m.size))
        .try_collect()
        .await
        .unwrap();
    all.sort();
    all
}
