use std::any::Any;
use std::ffi::{c_uint, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use cudarc::driver::sys;

use crate::backend::seam::{panic_message, BackendStream, Completion, DefaultStream, HomeThread};

use crate::backend::flags::DeviceFlag;
use crate::error::{Error, Result};

use super::context::DeviceContext;
use super::event::CudaEvent;
use super::handles::RawStream;

/// Bytes of pinned memory a stream keeps for staging copies to and from pageable memory.
const STAGING_BYTES: usize = 4 << 20;

/// `CU_STREAM_LEGACY`, a macro of `cuda.h` that cudarc does not bind: `((CUstream)0x1)`.
const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`: `((CUstream)0x2)`.
const CU_STREAM_PER_THREAD: usize = 0x2;

/// A `CUstream`: one created with `CU_STREAM_NON_BLOCKING` and destroyed on drop, or one of the
/// context's built-in default streams, which is never destroyed.
#[derive(Debug)]
pub(crate) struct CudaStream {
    ctx: Arc<DeviceContext>,
    raw: RawStream,
    /// Created by `cuStreamCreate`, so destroyed on drop; `false` for the default streams.
    owned: bool,
    /// The per-thread default stream's thread: the handle names the stream of whichever thread
    /// uses it, so [`AnyStream`](crate::backend::AnyStream) refuses every other thread.
    home: Option<HomeThread>,
    /// Pinned staging memory for pageable copies, allocated on first use. The lock is held while
    /// a staged copy is enqueued, so two copies never interleave their pieces in it; pieces on
    /// one stream run in order, so one buffer serves them all.
    staging: Mutex<Option<u64>>,
    /// cudarc's handle to this stream: made on first interop use, or the stream adopted from
    /// cudarc ([`CudaStream::adopt`], which it keeps alive). While a clone of it lives outside,
    /// dropping `self` does not destroy the `CUstream` (see `interop.rs`).
    pub(super) cudarc: OnceLock<Arc<cudarc::driver::CudaStream>>,
}

impl CudaStream {
    pub(crate) fn new(ctx: Arc<DeviceContext>) -> Result<Self> {
        ctx.bind()?;
        let mut raw: sys::CUstream = ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
        // SAFETY: the context is current; `raw` is a valid out-pointer.
        let r = unsafe { sys::cuStreamCreate(&mut raw, flags) };
        ctx.check("cuStreamCreate", r)?;
        super::retired::sweep_retired_streams();
        Ok(CudaStream {
            ctx,
            raw: RawStream(raw),
            owned: true,
            home: None,
            staging: Mutex::new(None),
            cudarc: OnceLock::new(),
        })
    }

    /// A handle to one of `ctx`'s built-in default streams. Nothing is created, and dropping it
    /// destroys nothing: the special handles name the stream of whichever context is current
    /// when they are used, which every method binds first. The per-thread one also names the
    /// stream of the calling thread: it belongs to this thread.
    pub(crate) fn builtin(ctx: Arc<DeviceContext>, kind: DefaultStream) -> Self {
        let (handle, home) = match kind {
            DefaultStream::Legacy => (CU_STREAM_LEGACY, None),
            DefaultStream::PerThread => (CU_STREAM_PER_THREAD, Some(HomeThread::current(ctx.id()))),
        };
        CudaStream {
            ctx,
            raw: RawStream(handle as sys::CUstream),
            owned: false,
            home,
            staging: Mutex::new(None),
            cudarc: OnceLock::new(),
        }
    }

    /// Adopts a stream made by cudarc (of `ctx`'s primary context: the caller checked): the
    /// stream is kept alive by the `Arc` held here and never destroyed by `self`.
    pub(crate) fn adopt(ctx: Arc<DeviceContext>, stream: Arc<cudarc::driver::CudaStream>) -> Self {
        let raw = RawStream(stream.cu_stream());
        CudaStream {
            ctx,
            raw,
            owned: false,
            home: None,
            staging: Mutex::new(None),
            cudarc: OnceLock::from(stream),
        }
    }

    /// The stream's pinned staging buffer, allocated on first use.
    fn staging(&self, slot: &mut Option<u64>) -> Result<u64> {
        if let Some(p) = *slot {
            return Ok(p);
        }
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: the context is current (callers bind first); `p` is a valid out-pointer.
        let r = unsafe { sys::cuMemHostAlloc(&mut p, STAGING_BYTES, 0) };
        self.ctx.check_alloc("cuMemHostAlloc", r, STAGING_BYTES)?;
        *slot = Some(p as u64);
        Ok(p as u64)
    }

    /// The driver's handle, valid while `self` lives.
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw.0
    }

    pub(crate) fn context(&self) -> &DeviceContext {
        &self.ctx
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if !self.ctx.bind_in_drop("a stream") {
            return; // the stream and its staging buffer leak: no driver call is possible here
        }
        let staging = self.staging.get_mut().take();
        if staging.is_some() {
            // Staged pieces still queued read or write the staging buffer: let them finish
            // before it is freed. Only streams that made pageable copies block here. The
            // per-thread default stream dropped on another thread than its own cannot be named
            // from here (its handle would name this thread's): the whole context is waited for.
            let (call, r) = match &self.home {
                Some(home) if !home.is_current() => {
                    // SAFETY: the context is current.
                    ("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
                }
                // SAFETY: the context is current and the stream live; with no home thread, or
                // on it, the handle names this stream.
                _ => ("cuStreamSynchronize", unsafe {
                    sys::cuStreamSynchronize(self.raw.0)
                }),
            };
            if let Err(error) = self.ctx.check(call, r) {
                tracing::error!("draining a stream with a staging buffer failed; leaking it");
                self.ctx.errors().report(error);
                return;
            }
        }
        if !self.owned {
            // A built-in default stream belongs to the context; its queued work runs on.
            free_staging(&self.ctx, staging);
            return;
        }
        if let Some(outside) = self.cudarc.take() {
            if Arc::strong_count(&outside) > 1 {
                // cudarc handles to it live on: destroy it once they are gone.
                super::retired::retire_stream(outside, self.ctx.clone(), self.raw);
                free_staging(&self.ctx, staging);
                return;
            }
        }
        // SAFETY: the stream was created by `cuStreamCreate` and is destroyed only here. Work
        // still queued on it (frees, host functions) runs to completion: the driver releases
        // the stream's resources once it is idle, without blocking this thread. No cudarc
        // handle to it is left (just above).
        let r = unsafe { sys::cuStreamDestroy_v2(self.raw.0) };
        if let Err(error) = self.ctx.check("cuStreamDestroy", r) {
            self.ctx.errors().report(error);
        }
        free_staging(&self.ctx, staging);
    }
}

/// Frees a stream's staging buffer once the stream that used it has drained.
fn free_staging(ctx: &DeviceContext, staging: Option<u64>) {
    if let Some(p) = staging {
        // SAFETY: `p` came from `cuMemHostAlloc`; the stream that used it has drained (the
        // caller synchronized it) and the stream handle is gone, so nothing uses it again.
        let r = unsafe { sys::cuMemFreeHost(p as *mut c_void) };
        if let Err(error) = ctx.check("cuMemFreeHost", r) {
            ctx.errors().report(error);
        }
    }
}

/// Reports a panic caught on a driver thread to the device's deferred errors and drops its
/// payload, without letting anything unwind further.
fn report_panic(ctx: &DeviceContext, payload: Box<dyn Any + Send>, what: &'static str) {
    // Reporting and dropping the payload run arbitrary code; a second panic is caught and its
    // payload forgotten, so nothing ever unwinds into the driver.
    let outcome = panic::catch_unwind(AssertUnwindSafe(move || {
        ctx.errors().report(Error::invalid(format!(
            "{what} panicked on a CUDA driver thread of {}: {}; the stream went on",
            ctx.id(),
            panic_message(&*payload)
        )));
        drop(payload);
    }));
    if let Err(payload) = outcome {
        std::mem::forget(payload);
    }
}

/// What a host function of this module owns: its work, and the context to report a panic to.
struct HostCall<W> {
    work: W,
    ctx: Arc<DeviceContext>,
}

/// Work that a host function of this module runs on the driver's thread.
trait HostWork: Send + 'static {
    /// What a panic report calls it.
    const WHAT: &'static str;
    fn run(self);
}

impl HostWork for Arc<Completion> {
    const WHAT: &'static str = "a completion";
    fn run(self) {
        self.complete();
    }
}

/// The boxed closure of [`CudaStream::host_fn`].
type HostFn = Box<dyn FnOnce() + Send>;

impl HostWork for HostFn {
    const WHAT: &'static str = "a host function";
    fn run(self) {
        self();
    }
}

/// The host function of [`CudaStream::launch_host_work`].
///
/// # Safety
/// 1. `user_data` came from `Box::<HostCall<W>>::into_raw` and this call owns it (the driver
///    calls each host function exactly once).
unsafe extern "C" fn host_work_trampoline<W: HostWork>(user_data: *mut c_void) {
    // SAFETY: by this function's contract, `user_data` is an owned box leaked by
    // `launch_host_work`; it is reclaimed exactly once, here. Taking it apart cannot panic.
    let call = unsafe { Box::from_raw(user_data.cast::<HostCall<W>>()) };
    // The work (a user's closure, through `Stream::launch_host_fn`) may use or drop handles of
    // this crate: their driver calls fail while this guard lives, instead of reaching the driver.
    let _inside = super::context::enter_host_fn();
    let HostCall { work, ctx } = *call;
    let outcome = panic::catch_unwind(AssertUnwindSafe(move || work.run()));
    if let Err(payload) = outcome {
        // Reporting formats and allocates: it must not unwind into the driver either. A panic
        // of its own is forgotten, not dropped (its payload's `Drop` could panic again).
        let report = AssertUnwindSafe(|| report_panic(&ctx, payload, W::WHAT));
        if let Err(again) = panic::catch_unwind(report) {
            std::mem::forget(again);
        }
    }
    // Dropping `ctx` here never drops the context (which would call the driver on its own
    // thread): the device's backend holds it, and CUDA devices live for the process.
}

impl CudaStream {
    /// Runs `enqueue`, the driver's `name` for an operation on `bytes` bytes on this stream,
    /// with the context current; an empty operation enqueues nothing.
    fn enqueue_bytes(
        &self,
        name: &'static str,
        bytes: usize,
        enqueue: impl FnOnce() -> sys::CUresult,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        self.ctx.check(name, enqueue())
    }

    /// Enqueues `work` to run on the driver's thread once the stream's prior work is done
    /// (`cuLaunchHostFunc`). `work` must make no driver call: a completion makes none, and a
    /// user closure's is the caller's contract (`BackendStream::host_fn`).
    fn launch_host_work<W: HostWork>(&self, work: W) -> Result<()> {
        self.ctx.bind()?;
        let call = HostCall {
            work,
            ctx: self.ctx.clone(),
        };
        let user_data = Box::into_raw(Box::new(call)).cast::<c_void>();
        // SAFETY: the context is current and the stream live. `host_work_trampoline::<W>`
        // matches `CUhostFn`, cannot unwind, and takes ownership of `user_data` (a
        // `Box<HostCall<W>>`) when the driver runs it, exactly once.
        let r = unsafe {
            sys::cuLaunchHostFunc(self.raw.0, Some(host_work_trampoline::<W>), user_data)
        };
        if let Err(e) = r.result() {
            // SAFETY: the launch failed, so the driver will never run the trampoline: the box
            // leaked above is still ours, and is reclaimed once, here.
            drop(unsafe { Box::from_raw(user_data.cast::<HostCall<W>>()) });
            return Err(self.ctx.error("cuLaunchHostFunc", e));
        }
        Ok(())
    }
}

impl BackendStream for CudaStream {
    type Event = CudaEvent;

    fn raw_handle(&self) -> u64 {
        self.raw.0 as u64
    }

    fn home_thread(&self) -> Option<&HomeThread> {
        self.home.as_ref()
    }

    fn record(&self) -> Result<Arc<CudaEvent>> {
        self.ctx.bind()?;
        let event = CudaEvent {
            raw: self.ctx.take_event()?,
            ctx: self.ctx.clone(),
        };
        // SAFETY: the context is current; the event and the stream are live handles of it. On
        // failure `event` drops and goes back to the idle list.
        let r = unsafe { sys::cuEventRecord(event.raw.0, self.raw.0) };
        self.ctx.check("cuEventRecord", r)?;
        Ok(Arc::new(event))
    }

    fn wait_event(&self, event: &CudaEvent) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current; both handles are live (the event is borrowed). The
        // driver may wait on an event of another device's context.
        let r = unsafe { sys::cuStreamWaitEvent(self.raw.0, event.raw.0, 0) };
        self.ctx.check("cuStreamWaitEvent", r)
    }

    fn notify(&self, completion: Arc<Completion>) -> Result<()> {
        self.launch_host_work(completion)
    }

    fn host_fn(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        self.launch_host_work(f)
    }

    fn write_flag(&self, flag: &DeviceFlag) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream live; the flag's word is pinned host
        // memory mapped for the device (`FlagSlab` over `cuMemHostAlloc`, see
        // `CudaBackend::flag_slab`), kept allocated until the token is seen or for ever (a
        // `DeviceFlag` dropped unseen leaks its slab), so the device's write lands in it.
        let r = unsafe {
            sys::cuStreamWriteValue32_v2(
                self.raw.0,
                flag.addr(),
                flag.token(),
                sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as std::ffi::c_uint,
            )
        };
        self.ctx.check("cuStreamWriteValue32", r)
    }

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.enqueue_bytes("cuMemcpyAsync", bytes, || {
            // SAFETY: the context is current and the stream live; both ranges are valid until
            // the copy completes and nothing else writes them (caller, 1 and 2). With unified
            // addressing the driver infers the direction, pageable host memory included.
            unsafe { sys::cuMemcpyAsync(dst, src, bytes, self.raw.0) }
        })
    }

    unsafe fn copy_peer(&self, dst: u64, src: u64, src_stream: &Self, bytes: usize) -> Result<()> {
        self.enqueue_bytes("cuMemcpyPeerAsync", bytes, || {
            // SAFETY: the context is current and the stream live; both contexts are retained by
            // their `DeviceContext`s (borrowed here); `dst` is memory of this stream's device
            // and `src` of `src_stream`'s, both valid until the copy completes, and nothing
            // else writes them meanwhile (caller, 1 and 2).
            unsafe {
                sys::cuMemcpyPeerAsync(
                    dst,
                    self.ctx.raw_context(),
                    src,
                    src_stream.ctx.raw_context(),
                    bytes,
                    self.raw.0,
                )
            }
        })
    }

    unsafe fn copy_pageable(&self, dst: u64, src: u64, bytes: usize, to_host: bool) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        let mut slot = self.staging.lock();
        let stage = self.staging(&mut slot)?;
        let mut done = 0;
        while done < bytes {
            let n = (bytes - done).min(STAGING_BYTES);
            let (d, s) = (dst + done as u64, src + done as u64);
            if to_host {
                // SAFETY: the context is current; `s..s + n` is device memory valid until the
                // copy completes (caller) and the staging buffer is ours, pinned, and not touched
                // by anything else while the lock is held and the stream runs pieces in order.
                let r = unsafe { sys::cuMemcpyAsync(stage, s, n, self.raw.0) };
                self.ctx.check("cuMemcpyAsync", r)?;
                let unstage = move || {
                    // SAFETY: runs after the piece above reached the staging buffer; `d` is
                    // pageable host memory valid until the copy completes (caller).
                    unsafe { ptr::copy_nonoverlapping(stage as *const u8, d as *mut u8, n) }
                };
                self.host_fn(Box::new(unstage))?;
            } else {
                let stage_in = move || {
                    // SAFETY: runs when the stream reaches it, before the piece below reads the
                    // staging buffer; `s` is host memory valid until the copy completes (caller).
                    unsafe { ptr::copy_nonoverlapping(s as *const u8, stage as *mut u8, n) }
                };
                self.host_fn(Box::new(stage_in))?;
                // SAFETY: the context is current; the staging buffer holds this piece by the
                // time the stream runs the copy; `d..d + n` is valid device memory (caller).
                let r = unsafe { sys::cuMemcpyAsync(d, stage, n, self.raw.0) };
                self.ctx.check("cuMemcpyAsync", r)?;
            }
            done += n;
        }
        Ok(())
    }

    unsafe fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        self.enqueue_bytes("cuMemsetD8Async", bytes, || {
            // SAFETY: the context is current and the stream live; the range is valid device
            // memory until the operation completes (caller).
            unsafe { sys::cuMemsetD8Async(dst, value, bytes, self.raw.0) }
        })
    }

    fn delay(&self, duration: Duration) -> Result<()> {
        self.ctx.bind()?;
        let kernel = self.ctx.spin_kernel()?;
        let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: the context is current; the kernel belongs to it (its module stays loaded
        // while `self.ctx` lives) and the stream is live.
        unsafe { kernel.launch(self.raw.0, ns) }.map_err(|e| self.ctx.error("cuLaunchKernel", e))
    }

    fn synchronize_blocking(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the context is current and the stream live.
        let r = unsafe { sys::cuStreamSynchronize(self.raw.0) };
        self.ctx.check("cuStreamSynchronize", r)
    }
}
