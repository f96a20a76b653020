//! The conformance suite against the MemoryStore.

use std::sync::Arc;

use async_trait::async_trait;
use tollgate::testkit::StoreFactory;
use tollgate::{Allocator, CapabilityKey, GrantPolicy, MemoryStore};

struct MemoryFactory;

#[async_trait]
impl StoreFactory for MemoryFactory {
    async fn store(&self, policy: GrantPolicy) -> Arc<dyn Allocator> {
        let key = CapabilityKey::generate().expect("random key");
        Arc::new(MemoryStore::new(policy, key).expect("memory store"))
    }
}

tollgate::conformance_tests!(MemoryFactory);
