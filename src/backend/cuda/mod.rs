//! The CUDA backend (placeholder until implemented).
use crate::error::{Error, Result};

pub(crate) fn device_count() -> Result<usize> {
    Err(Error::DriverUnavailable("not implemented".into()))
}

#[derive(Debug)]
pub(crate) struct CudaBackend;

impl CudaBackend {
    pub(crate) fn new(_ordinal: usize) -> Result<Self> {
        Err(Error::DriverUnavailable("not implemented".into()))
    }
}

impl crate::backend::Backend for CudaBackend {
    fn id(&self) -> crate::DeviceId {
        unimplemented!()
    }
    fn name(&self) -> String {
        unimplemented!()
    }
    fn memory_info(&self) -> Result<crate::MemoryInfo> {
        unimplemented!()
    }
    fn allocate(&self, _: crate::backend::MemoryKind, _: usize) -> Result<u64> {
        unimplemented!()
    }
    unsafe fn free(
        &self,
        _: crate::backend::MemoryKind,
        _: u64,
        _: usize,
        _: &dyn crate::backend::BackendStream,
    ) -> Result<()> {
        unimplemented!()
    }
    fn create_stream(&self) -> Result<std::sync::Arc<dyn crate::backend::BackendStream>> {
        unimplemented!()
    }
    fn create_pool(
        &self,
        _: &crate::backend::PoolConfig,
    ) -> Result<std::sync::Arc<dyn crate::backend::BackendPool>> {
        unimplemented!()
    }
    fn default_pool(&self) -> Result<std::sync::Arc<dyn crate::backend::BackendPool>> {
        unimplemented!()
    }
}
