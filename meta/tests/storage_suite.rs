//! openraft's storage conformance suite against both `KvStore` backends.

use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};
use sluice_meta::raft::{LogStore, StateMachine, TypeConfig};
use sluice_meta::store::{MemStore, SledStore};

struct MemBuilder;

impl StoreBuilder<TypeConfig, LogStore<MemStore>, StateMachine<MemStore>, tempfile::TempDir>
    for MemBuilder
{
    async fn build(
        &self,
    ) -> Result<
        (
            tempfile::TempDir,
            LogStore<MemStore>,
            StateMachine<MemStore>,
        ),
        StorageError<u64>,
    > {
        let dir = tempfile::tempdir().map_err(|e| openraft::StorageIOError::write(&e))?;
        let kv = Arc::new(MemStore::new());
        let sm = StateMachine::open(kv.clone(), dir.path().join("snapshots")).await?;
        Ok((dir, LogStore::new(kv), sm))
    }
}

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore<SledStore>, StateMachine<SledStore>, tempfile::TempDir>
    for SledBuilder
{
    async fn build(
        &self,
    ) -> Result<
        (
            tempfile::TempDir,
            LogStore<SledStore>,
            StateMachine<SledStore>,
        ),
        StorageError<u64>,
    > {
        let dir = tempfile::tempdir().map_err(|e| openraft::StorageIOError::write(&e))?;
        let kv = Arc::new(
            SledStore::open(dir.path(), 4 << 20)
                .map_err(|e| openraft::StorageIOError::write(&e))?,
        );
        let sm = StateMachine::open(kv.clone(), dir.path().join("snapshots")).await?;
        Ok((dir, LogStore::new(kv), sm))
    }
}

#[test]
fn mem_store_passes_openraft_suite() {
    Suite::test_all(MemBuilder).expect("openraft suite on MemStore");
}

#[test]
fn sled_store_passes_openraft_suite() {
    Suite::test_all(SledBuilder).expect("openraft suite on SledStore");
}
