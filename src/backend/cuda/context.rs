//! The driver and a device's context: loading `libcuda` and `cuInit` ([`device_count`]) and
//! the primary context every call binds ([`DeviceContext`]).

use std::cell::Cell;
use std::ffi::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::{Arc, OnceLock};

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;
use parking_lot::Mutex;

use crate::backend::seam::ErrorSink;
use crate::error::{Error, Result};
use crate::ids::DeviceId;

use super::handles::{RawContext, RawEvent};
use super::spin::SpinKernel;

/// Every driver entry point this backend calls (cudarc's `sys` names). They are looked up once,
/// before the first call, because cudarc's dynamic loading panics on a missing symbol.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceGetDefaultMemPool",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemAllocManaged",
    "cuMemHostAlloc",
    "cuMemFree_v2",
    "cuMemFreeHost",
    "cuMemcpyAsync",
    "cuMemsetD8Async",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuLaunchHostFunc",
    "cuLaunchKernel",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolSetAttribute",
    "cuMemPoolGetAttribute",
    "cuMemPoolTrimTo",
    "cuMemAllocFromPoolAsync",
    "cuMemFreeAsync",
];

/// The driver's name for a result code, e.g. `CUDA_ERROR_INVALID_VALUE`.
pub(super) fn error_name(e: DriverError) -> String {
    match e.error_name() {
        Ok(name) => name.to_string_lossy().into_owned(),
        // cudarc's enum spells the same names.
        Err(_) => format!("{:?}", e.0),
    }
}

/// Loads and initialises the driver once; the number of devices, or why there is no driver.
fn init_driver() -> Result<usize> {
    // SAFETY: `is_culib_present` only tries to open the library under its candidate names (and
    // closes it again); it calls nothing in it.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::DriverUnavailable(
            "libcuda could not be loaded (no NVIDIA driver installed, or not on the library path)"
                .into(),
        ));
    }
    // SAFETY: the library is present (checked above), so `culib` opens it instead of panicking.
    // Looking symbols up runs no code of the library.
    let lib = unsafe { sys::culib() };
    for name in REQUIRED_SYMBOLS {
        // SAFETY: the symbol is only looked up, never called through this pointer type.
        if unsafe { lib.get::<*const c_void>(*name) }.is_err() {
            return Err(Error::DriverUnavailable(format!(
                "libcuda lacks {name}: the NVIDIA driver is too old for this build"
            )));
        }
    }
    // SAFETY: `cuInit` is present (checked above) and takes no pointers.
    match unsafe { sys::cuInit(0) }.result() {
        Ok(()) => {}
        Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => return Ok(0),
        Err(e) => {
            return Err(Error::DriverUnavailable(format!(
                "cuInit failed: {} ({})",
                error_name(e),
                e.0 as i32
            )))
        }
    }
    let mut version: c_int = 0;
    // SAFETY: the driver is initialised; `version` is a valid out-pointer.
    if unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .is_ok()
    {
        tracing::debug!(version, "CUDA driver initialised");
    }
    let mut count: c_int = 0;
    // SAFETY: the driver is initialised; `count` is a valid out-pointer.
    unsafe { sys::cuDeviceGetCount(&mut count) }
        .result()
        .map_err(|e| {
            Error::DriverUnavailable(format!(
                "cuDeviceGetCount failed: {} ({})",
                error_name(e),
                e.0 as i32
            ))
        })?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// How many CUDA devices the driver reports. The first call loads and initialises the driver;
/// its outcome is cached for the process.
///
/// # Errors
/// [`Error::DriverUnavailable`] when `libcuda` is missing, too old, or `cuInit` fails.
pub(crate) fn device_count() -> Result<usize> {
    static INIT: OnceLock<Result<usize>> = OnceLock::new();
    INIT.get_or_init(init_driver).clone()
}

thread_local! {
    /// Set while this thread runs one of this backend's host functions: CUDA forbids every
    /// driver call there (it may fail or deadlock), so [`DeviceContext::bind`], which every
    /// driver call of this crate goes through first, refuses them.
    static IN_HOST_FN: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as inside a host function until dropped
/// ([`enter_host_fn`]).
pub(super) struct HostFnGuard {
    was: bool,
}

/// Marks the calling thread (a driver thread, running one of this backend's host functions)
/// as inside a host function until the guard drops: from then on the crate's driver calls on
/// it fail instead of reaching the driver.
pub(super) fn enter_host_fn() -> HostFnGuard {
    HostFnGuard {
        was: IN_HOST_FN.with(|f| f.replace(true)),
    }
}

impl Drop for HostFnGuard {
    fn drop(&mut self) {
        IN_HOST_FN.with(|f| f.set(self.was));
    }
}

/// Most events kept for reuse per device; more are destroyed on drop.
pub(super) const MAX_IDLE_EVENTS: usize = 1024;

/// A device's primary context and what hangs off it; shared by the backend and every stream,
/// event and pool of the device, so it outlives them all.
#[derive(Debug)]
pub(crate) struct DeviceContext {
    id: DeviceId,
    pub(super) device: sys::CUdevice,
    /// Retained in [`CudaBackend::new`](super::CudaBackend::new), released in `Drop`.
    ctx: RawContext,
    /// Events (created with `CU_EVENT_DISABLE_TIMING`) that nobody refers to any more, kept so
    /// that `record` does not pay `cuEventCreate` each time. Re-recording is safe: a stream that
    /// waited on an event waits for the record that preceded its `cuStreamWaitEvent`.
    pub(super) idle_events: Mutex<Vec<RawEvent>>,
    /// The delay kernel, loaded on first use (a JIT compile).
    spin: OnceLock<Result<SpinKernel>>,
    /// cudarc's handle to the same primary context, made on first interop use.
    cudarc: OnceLock<Arc<cudarc::driver::CudaContext>>,
    /// Errors met on driver threads and in `Drop`s, for the device to take.
    errors: ErrorSink,
}

impl DeviceContext {
    /// Takes over `ctx`, the primary context of `device` that the caller retained: it is
    /// released when the `DeviceContext` drops.
    pub(super) fn new(id: DeviceId, device: sys::CUdevice, ctx: RawContext) -> Self {
        DeviceContext {
            id,
            device,
            ctx,
            idle_events: Mutex::new(Vec::new()),
            spin: OnceLock::new(),
            cudarc: OnceLock::new(),
            errors: ErrorSink::default(),
        }
    }

    pub(crate) fn id(&self) -> DeviceId {
        self.id
    }

    /// Makes this device's primary context current on the calling thread, unless it is already.
    ///
    /// The driver is asked which context is current (`cuCtxGetCurrent`, a read of the
    /// driver's per-thread state, cheap next to any call it precedes) every time: this crate
    /// keeps no cache of its own, because other code on the thread binds contexts without
    /// telling it (cudarc, through `streamalloc::cudarc` too, each of whose launches binds its
    /// stream's context; cuBLAS; the runtime API's `cudaSetDevice`; user FFI), and a stale
    /// cache would run this crate's next call in someone else's context (an allocation of
    /// device 0 made in device 1's). Clearing a cache whenever control leaves the crate would
    /// clear it on every return, so it would never hit. cudarc's `bind_to_thread` does the
    /// same.
    ///
    /// Inside one of this backend's host functions (a closure of
    /// [`Stream::launch_host_fn`](crate::Stream::launch_host_fn) that uses or drops a handle of
    /// this crate) it refuses instead: CUDA forbids driver calls there.
    ///
    /// # Errors
    /// `cuCtxGetCurrent` and `cuCtxSetCurrent` failures; [`Error::Unsupported`] inside a host
    /// function.
    pub(crate) fn bind(&self) -> Result<()> {
        if IN_HOST_FN.try_with(Cell::get).unwrap_or(false) {
            return Err(Error::unsupported(
                "CUDA driver calls inside a host function (a Stream::launch_host_fn closure \
                 that uses or drops a handle of this crate); CUDA forbids them there",
                self.id,
            ));
        }
        let ctx = self.ctx.0;
        let mut current: sys::CUcontext = ptr::null_mut();
        // SAFETY: `current` is a valid out-pointer; the call only reads the thread's state.
        let r = unsafe { sys::cuCtxGetCurrent(&mut current) };
        self.check("cuCtxGetCurrent", r)?;
        if current == ctx {
            return Ok(());
        }
        // SAFETY: `ctx` is this device's primary context, retained by `self` until it drops.
        unsafe { sys::cuCtxSetCurrent(ctx) }
            .result()
            .map_err(|e| self.error("cuCtxSetCurrent", e))
    }

    /// cudarc's handle to this device's primary context (the one every call of this crate
    /// binds), made on first use and then shared.
    ///
    /// # Errors
    /// Driver errors of `CudaContext::new`; [`Error::InvalidArgument`] should cudarc's context
    /// not be the primary context this crate uses.
    pub(crate) fn cudarc_context(&self) -> Result<Arc<cudarc::driver::CudaContext>> {
        if let Some(ctx) = self.cudarc.get() {
            return Ok(ctx.clone());
        }
        let ordinal = self.id.ordinal as usize;
        let ctx = cudarc::driver::CudaContext::new(ordinal)
            .map_err(|e| self.error("cuDevicePrimaryCtxRetain (cudarc)", e))?;
        if ctx.cu_ctx() != self.ctx.0 {
            return Err(Error::invalid(format!(
                "cudarc's primary context of {} ({:p}) is not the one streamalloc uses ({:p})",
                self.id,
                ctx.cu_ctx(),
                self.ctx.0
            )));
        }
        // A racing thread may have set it first: both retain the same primary context.
        Ok(self.cudarc.get_or_init(|| ctx).clone())
    }

    /// The raw primary context, valid while `self` lives (for calls that name a context, such
    /// as `cuMemcpyPeerAsync`).
    pub(crate) fn raw_context(&self) -> sys::CUcontext {
        self.ctx.0
    }

    /// [`bind`](Self::bind) for `Drop` impls: defers a failure to the device (which logs it)
    /// and says whether it bound.
    pub(crate) fn bind_in_drop(&self, what: &'static str) -> bool {
        match self.bind() {
            Ok(()) => true,
            Err(error) => {
                tracing::error!(device = %self.id, "binding the context to drop {what} failed");
                self.errors.report(error);
                false
            }
        }
    }

    /// Where errors met on driver threads and in `Drop`s go: the device takes them into its
    /// deferred errors.
    pub(crate) fn errors(&self) -> &ErrorSink {
        &self.errors
    }

    /// `r` of a free of `ptr` as a crate result. `CUDA_ERROR_INVALID_VALUE` there means the
    /// driver does not know the pointer (freed already, or never allocated here): the caller's
    /// mistake, reported as [`Error::InvalidArgument`] naming the pointer, as the host backend
    /// does.
    pub(crate) fn check_free(&self, call: &'static str, r: sys::CUresult, ptr: u64) -> Result<()> {
        r.result().map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
                Error::invalid(format!(
                    "free of unknown pointer {ptr:#x} on {} (never allocated there, or freed \
                     already): {call} failed with {}",
                    self.id,
                    error_name(e)
                ))
            } else {
                self.error(call, e)
            }
        })
    }

    /// The crate error for a failed driver call.
    pub(crate) fn error(&self, call: &'static str, e: DriverError) -> Error {
        Error::Driver {
            call,
            code: e.0 as i32,
            name: error_name(e),
            device: self.id,
        }
    }

    /// `r` as a crate result.
    pub(crate) fn check(&self, call: &'static str, r: sys::CUresult) -> Result<()> {
        r.result().map_err(|e| self.error(call, e))
    }

    /// `r` of an allocation of `requested` bytes as a crate result: out-of-memory is
    /// [`Error::OutOfMemory`].
    pub(crate) fn check_alloc(
        &self,
        call: &'static str,
        r: sys::CUresult,
        requested: usize,
    ) -> Result<()> {
        r.result().map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                Error::OutOfMemory {
                    details: None,
                    requested,
                    available: None,
                    device: self.id,
                }
            } else {
                self.error(call, e)
            }
        })
    }

    /// A device attribute. The caller has bound the context.
    pub(super) fn attribute(&self, attribute: sys::CUdevice_attribute) -> Result<i32> {
        let mut value: c_int = 0;
        // SAFETY: `self.device` came from `cuDeviceGet`; `value` is a valid out-pointer.
        let r = unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, self.device) };
        self.check("cuDeviceGetAttribute", r)?;
        Ok(value)
    }

    /// An event to record: an idle one, or a new one. The caller has bound the context.
    pub(crate) fn take_event(&self) -> Result<RawEvent> {
        if let Some(event) = self.idle_events.lock().pop() {
            return Ok(event);
        }
        let mut event: sys::CUevent = ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint;
        // SAFETY: the context is current (caller); `event` is a valid out-pointer.
        let r = unsafe { sys::cuEventCreate(&mut event, flags) };
        self.check("cuEventCreate", r)?;
        Ok(RawEvent(event))
    }

    /// Takes back an event that nobody refers to any more: keeps it for reuse or destroys it.
    /// Makes no driver call unless the idle list is full.
    pub(crate) fn recycle_event(&self, event: RawEvent) {
        {
            let mut idle = self.idle_events.lock();
            if idle.len() < MAX_IDLE_EVENTS {
                idle.push(event);
                return;
            }
        }
        self.destroy_event(event);
    }

    fn destroy_event(&self, event: RawEvent) {
        if !self.bind_in_drop("an event") {
            return; // leaked: no driver call is possible here
        }
        // SAFETY: `event` was created by `cuEventCreate` in this context and nothing refers to
        // it any more (its owner gave it up); destroying a pending event is allowed.
        let r = unsafe { sys::cuEventDestroy_v2(event.0) };
        if let Err(error) = self.check("cuEventDestroy", r) {
            self.errors.report(error);
        }
    }

    /// The delay kernel of this context, loaded (JIT-compiled) on first use. The caller has
    /// bound the context.
    pub(crate) fn spin_kernel(&self) -> Result<&SpinKernel> {
        self.spin
            .get_or_init(|| {
                SpinKernel::load(self.id).map_err(|first| match first {
                    Some((call, e)) => self.error(call, e),
                    None => Error::invalid("no PTX image for the delay kernel"),
                })
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        if !self.bind_in_drop("a device context") {
            return; // leaked (the primary context stays retained): no driver call is possible
        }
        for event in std::mem::take(&mut *self.idle_events.lock()) {
            // SAFETY: idle events were created in this context and nobody refers to them.
            let r = unsafe { sys::cuEventDestroy_v2(event.0) };
            if let Err(error) = self.check("cuEventDestroy", r) {
                tracing::error!(%error, "destroying an idle event");
            }
        }
        if let Some(Ok(kernel)) = self.spin.get() {
            // SAFETY: the module was loaded in this context; every stream, which is all that
            // could launch its kernel, held an `Arc` of `self` and is gone.
            let r = unsafe { sys::cuModuleUnload(kernel.module().0) };
            if let Err(error) = self.check("cuModuleUnload", r) {
                tracing::error!(%error, "unloading the delay kernel");
            }
        }
        // SAFETY: `self.device` came from `cuDeviceGet`, and `CudaBackend::new` retained its
        // primary context once for this value; this is the matching release.
        let r = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
        if let Err(error) = self.check("cuDevicePrimaryCtxRelease", r) {
            tracing::error!(%error, "releasing the primary context");
        }
    }
}
