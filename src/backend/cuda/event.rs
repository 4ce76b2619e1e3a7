//! CUDA events: a recorded `CUevent`, queried and waited on.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys;

use crate::backend::seam::BackendEvent;
use crate::error::Result;

use super::context::DeviceContext;
use super::handles::RawEvent;

/// A recorded `CUevent` (`CU_EVENT_DISABLE_TIMING`); goes back to its device's idle list on drop.
pub(crate) struct CudaEvent {
    pub(super) ctx: Arc<DeviceContext>,
    pub(super) raw: RawEvent,
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // Binds (and destroys) only when the idle list is full.
        self.ctx.recycle_event(self.raw);
    }
}

impl fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaEvent")
            .field("device", &self.ctx.id())
            .field("raw", &self.raw)
            .finish()
    }
}

impl BackendEvent for CudaEvent {
    fn query(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: the context is current; the event is live while `self` is.
        match unsafe { sys::cuEventQuery(self.raw.0) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => self.ctx.check("cuEventQuery", r).map(|()| false),
        }
    }

    fn synchronize_blocking(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current; the event is live while `self` is.
        let r = unsafe { sys::cuEventSynchronize(self.raw.0) };
        self.ctx.check("cuEventSynchronize", r)
    }
}
