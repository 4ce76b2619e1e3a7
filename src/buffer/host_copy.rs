//! Host↔device copies that own their host buffer until the device is done with it.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Wake, Waker};

use crate::error::{Error, Result};
use crate::resource::DevicePtr;
use crate::stream::{Event, Stream};

mod sealed {
    /// Turns an owned heap buffer into raw parts and back. Private: only the types listed in
    /// this module may be [`HostBuffer`](super::HostBuffer)s.
    pub trait Sealed: Sized {
        /// The number of bytes the buffer holds.
        fn byte_len(&self) -> usize;

        /// Gives up ownership: (address, length, capacity). The address stays valid until
        /// `from_raw_parts` rebuilds the value.
        fn into_raw_parts(self) -> (*mut u8, usize, usize);

        /// Rebuilds the value.
        ///
        /// # Safety
        /// 1. The parts came from `into_raw_parts` of `Self` and are used once.
        /// 2. Nothing else accesses the bytes any more.
        unsafe fn from_raw_parts(ptr: *mut u8, len: usize, cap: usize) -> Self;
    }
}

/// Host memory that an async copy may own while the device reads or writes it: `Vec<u8>` and
/// `Box<[u8]>`.
///
/// Both keep their bytes on the heap, so the address the device uses does not change when the
/// value moves into and out of a copy future. The trait is sealed: arrays and other types whose
/// bytes move with the value (or that are not uniquely owned) cannot implement it.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mut buf = DeviceBuffer::new(4, &stream, CudaResource::new(&device)).await?;
/// let boxed: Box<[u8]> = vec![1, 2, 3, 4].into_boxed_slice();
/// let boxed = buf.copy_from_host(boxed).await?;      // handed back when the copy is done
/// let back = buf.copy_to_host(vec![0u8; 4]).await?;
/// assert_eq!(&back[..], &boxed[..]);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub trait HostBuffer: sealed::Sealed + Send + Unpin + 'static {}

impl sealed::Sealed for Vec<u8> {
    fn byte_len(&self) -> usize {
        self.len()
    }

    fn into_raw_parts(self) -> (*mut u8, usize, usize) {
        let mut v = ManuallyDrop::new(self);
        (v.as_mut_ptr(), v.len(), v.capacity())
    }

    unsafe fn from_raw_parts(ptr: *mut u8, len: usize, cap: usize) -> Self {
        // SAFETY: by the caller's contract the parts came from `into_raw_parts` above, i.e.
        // from a `Vec<u8>` that was never dropped.
        unsafe { Vec::from_raw_parts(ptr, len, cap) }
    }
}

impl HostBuffer for Vec<u8> {}

impl sealed::Sealed for Box<[u8]> {
    fn byte_len(&self) -> usize {
        self.len()
    }

    fn into_raw_parts(self) -> (*mut u8, usize, usize) {
        let len = self.len();
        (Box::into_raw(self).cast::<u8>(), len, len)
    }

    unsafe fn from_raw_parts(ptr: *mut u8, len: usize, _cap: usize) -> Self {
        // SAFETY: by the caller's contract the parts came from `Box::into_raw` of a `Box<[u8]>`
        // of `len` bytes, rebuilt once.
        unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) }
    }
}

impl HostBuffer for Box<[u8]> {}

/// A host buffer taken apart while the device may access its bytes. Dropping it leaks the
/// buffer (it has no `Drop`): leaking is the safe default when it is unknown whether the
/// device is done.
struct RawHost<B> {
    ptr: *mut u8,
    len: usize,
    cap: usize,
    _owns: PhantomData<B>,
}

// SAFETY: a `RawHost<B>` is the unique owner of a `B`'s heap bytes (it was taken apart by value);
// sending it sends that ownership, which is sound because `B: Send`.
unsafe impl<B: Send> Send for RawHost<B> {}
// SAFETY: `&RawHost` gives access to nothing but the address as a number and the length.
unsafe impl<B: Sync> Sync for RawHost<B> {}

impl<B: HostBuffer> RawHost<B> {
    fn new(host: B) -> Self {
        let (ptr, len, cap) = host.into_raw_parts();
        RawHost {
            ptr,
            len,
            cap,
            _owns: PhantomData,
        }
    }

    fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Rebuilds the buffer.
    ///
    /// # Safety
    /// The device no longer accesses the bytes: every copy enqueued on them has completed (or
    /// none was enqueued).
    unsafe fn reclaim(self) -> B {
        // SAFETY: the parts came from `B::into_raw_parts` in `new` and `self` is consumed, so they
        // are used once; the caller guarantees the device is done with the bytes.
        unsafe { B::from_raw_parts(self.ptr, self.len, self.cap) }
    }
}

/// Hands `host` to a host function on `stream` that drops it once the stream has passed every
/// copy enqueued on it so far. If that cannot be enqueued the buffer is leaked, never freed under
/// the device. Never blocks.
fn release_after<B: HostBuffer>(stream: &Stream, host: RawHost<B>) {
    let release = move || {
        // SAFETY: this host function runs once `stream` has reached it, after the copy that was
        // enqueued on `stream` before it.
        drop(unsafe { host.reclaim() });
    };
    if let Err(e) = stream.launch_host_fn(release) {
        // The closure, and with it the `RawHost`, is dropped: the buffer leaks.
        tracing::warn!(error = %e, "leaking a host buffer whose copy may still be running");
        stream.device().defer_error(e);
    }
}

/// Watches the event after a copy whose future was dropped before the copy completed, and hands
/// a failure the stream reports there to the device's deferred errors
/// ([`Device::take_deferred_error`](crate::Device::take_deferred_error)): nobody is left to
/// return it to. It is its own waker, woken by the device's completion driver; it makes no
/// driver call when woken (the event is then complete and its outcome known), so it may run
/// inside a CUDA host function.
struct DroppedCopy {
    done: Event,
}

impl DroppedCopy {
    /// Starts watching `done`.
    fn watch(done: Event) {
        Arc::new(DroppedCopy { done }).poll_done();
    }

    /// Polls the event with this watcher as waker: defers a failure, stops on success, and
    /// stays registered otherwise.
    fn poll_done(self: &Arc<Self>) {
        let waker = Waker::from(self.clone());
        let mut done = self.done.clone();
        if let Poll::Ready(Err(e)) = Pin::new(&mut done).poll(&mut Context::from_waker(&waker)) {
            self.done.stream().device().defer_error(e);
        }
    }
}

impl Wake for DroppedCopy {
    fn wake(self: Arc<Self>) {
        self.poll_done();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.poll_done();
    }
}

enum State<B> {
    /// Nothing is in flight: the result is known.
    Ready(Option<Result<B>>),
    /// A copy is enqueued; `done` completes after it.
    InFlight {
        done: Event,
        host: Option<RawHost<B>>,
    },
}

/// The core of [`CopyToHost`] and [`CopyFromHost`]: a copy enqueued at creation, and the host
/// buffer it owns until an event after the copy completes.
struct HostTransfer<B: HostBuffer> {
    state: State<B>,
    bytes: usize,
}

impl<B: HostBuffer> HostTransfer<B> {
    fn ready(result: Result<B>, bytes: usize) -> Self {
        HostTransfer {
            state: State::Ready(Some(result)),
            bytes,
        }
    }

    /// Takes `host` apart, calls `enqueue` with its address and records an event after it.
    /// `bytes == 0` enqueues nothing.
    fn start(
        stream: &Stream,
        host: B,
        bytes: usize,
        enqueue: impl FnOnce(u64) -> Result<()>,
    ) -> Self {
        if bytes == 0 {
            return Self::ready(Ok(host), 0);
        }
        let raw = RawHost::new(host);
        if let Err(e) = enqueue(raw.addr()) {
            // A failed enqueue leaves nothing queued on a working stream, but be safe anyway.
            release_after(stream, raw);
            return Self::ready(Err(e), bytes);
        }
        match stream.record() {
            Ok(done) => HostTransfer {
                state: State::InFlight {
                    done,
                    host: Some(raw),
                },
                bytes,
            },
            Err(e) => {
                release_after(stream, raw);
                Self::ready(Err(e), bytes)
            }
        }
    }

    fn poll_transfer(&mut self, cx: &mut Context<'_>) -> Poll<Result<B>> {
        match &mut self.state {
            State::Ready(result) => Poll::Ready(
                result
                    .take()
                    .expect("a host copy future polled after completion"),
            ),
            State::InFlight { done, host } => {
                let outcome = ready!(Pin::new(&mut *done).poll(cx));
                let raw = host
                    .take()
                    .expect("a host copy future polled after completion");
                let result = match outcome {
                    // SAFETY: `done` was recorded after the copy on the same stream and has
                    // completed, so the device is done with the bytes.
                    Ok(()) => Ok(unsafe { raw.reclaim() }),
                    Err(e) => {
                        // The stream failed: whether the copy ran is unknown.
                        release_after(done.stream(), raw);
                        Err(e)
                    }
                };
                self.state = State::Ready(None);
                Poll::Ready(result)
            }
        }
    }
}

impl<B: HostBuffer> Drop for HostTransfer<B> {
    fn drop(&mut self) {
        if let State::InFlight { done, host } = &mut self.state {
            if let Some(raw) = host.take() {
                match done.is_complete() {
                    // SAFETY: `done` follows the copy on its stream and has completed.
                    Ok(true) => drop(unsafe { raw.reclaim() }),
                    Ok(false) => {
                        // Never block here: let the stream drop the buffer after the copy, and
                        // watch the copy so that a failure still reaches the user.
                        release_after(done.stream(), raw);
                        DroppedCopy::watch(done.clone());
                    }
                    Err(e) => {
                        // The stream failed: whether the copy ran is unknown.
                        release_after(done.stream(), raw);
                        done.stream().device().defer_error(e);
                    }
                }
            }
        }
    }
}

impl<B: HostBuffer> fmt::Debug for HostTransfer<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Ready(Some(Ok(_))) => "ready",
            State::Ready(Some(Err(_))) => "failed",
            State::Ready(None) => "finished",
            State::InFlight { .. } => "in flight",
        };
        f.debug_struct("HostTransfer")
            .field("bytes", &self.bytes)
            .field("state", &state)
            .finish()
    }
}

/// The future of [`DeviceBuffer::copy_to_host`](super::DeviceBuffer::copy_to_host): resolves to
/// the host buffer, its first `len()` bytes filled from the device buffer, once the copy has
/// completed.
///
/// The copy is enqueued on the buffer's owning stream when `copy_to_host` is called, not at the
/// first poll; the future only waits for an event recorded after it, without blocking a thread.
/// It borrows nothing: the device buffer may be handed on or dropped meanwhile, since its free
/// and every later write are ordered after the copy.
///
/// # Errors
/// [`Error::InvalidArgument`] when the host buffer is shorter than the device buffer (the host
/// buffer is then dropped: nothing was enqueued); driver errors when enqueuing or waiting fails
/// (the host buffer is then dropped once the stream has passed the copy, or leaked).
///
/// # Cancel safety
/// Dropping the future before it resolves does not cancel the copy, and does not free the host
/// buffer under it: the buffer is handed to a host function enqueued on the same stream, which
/// drops it once the copy is done. If the copy then fails, its error goes to the device's
/// deferred errors ([`Device::take_deferred_error`](crate::Device::take_deferred_error)), since
/// no future is left to return it. `mem::forget` of the future leaks the host buffer and loses
/// such an error. Neither blocks.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mut buf = DeviceBuffer::new(16, &stream, CudaResource::new(&device)).await?;
/// buf.fill(3)?;
/// let copy = buf.copy_to_host(vec![0u8; 20]); // enqueued here
/// let host = copy.await?;                     // handed back here
/// assert_eq!(&host[..16], &[3u8; 16]);
/// assert_eq!(&host[16..], &[0u8; 4]);         // the rest is untouched
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[must_use = "the copy is enqueued, but its host buffer comes back only by awaiting the future"]
pub struct CopyToHost<B: HostBuffer> {
    transfer: HostTransfer<B>,
}

impl<B: HostBuffer> CopyToHost<B> {
    /// Enqueues a copy of `bytes` from `src` into the start of `host` on `stream`.
    ///
    /// # Safety
    /// `src..src + bytes` is device memory that is freed, and written by other streams, only
    /// after work on `stream` enqueued now has completed.
    pub(crate) unsafe fn start(stream: &Stream, src: DevicePtr, bytes: usize, host: B) -> Self {
        let host_len = host.byte_len();
        if host_len < bytes {
            let e = Error::invalid(format!(
                "copy_to_host: the device buffer holds {bytes} bytes, the host buffer only \
                 {host_len}"
            ));
            return CopyToHost {
                transfer: HostTransfer::ready(Err(e), bytes),
            };
        }
        let transfer = HostTransfer::start(stream, host, bytes, |dst| {
            // SAFETY: `dst` is the start of the host buffer, at least `bytes` long (checked
            // above), owned by the transfer until an event after this copy completes; `src` is
            // valid and not written concurrently by this function's contract.
            unsafe { stream.raw().copy_pageable(dst, src.addr(), bytes, true) }
        });
        CopyToHost { transfer }
    }
}

impl<B: HostBuffer> Future for CopyToHost<B> {
    type Output = Result<B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<B>> {
        self.get_mut().transfer.poll_transfer(cx)
    }
}

impl<B: HostBuffer> fmt::Debug for CopyToHost<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CopyToHost")
            .field("transfer", &self.transfer)
            .finish()
    }
}

/// The future of [`DeviceBuffer::copy_from_host`](super::DeviceBuffer::copy_from_host):
/// resolves to the host buffer, unchanged, once its bytes have been copied to the device.
///
/// The copy is enqueued on the buffer's owning stream when `copy_from_host` is called, not at
/// the first poll; the future only waits for an event recorded after it, without blocking a
/// thread. Work enqueued on the owning stream afterwards already sees the new bytes, whether or
/// not the future is awaited.
///
/// # Errors
/// [`Error::InvalidArgument`] when the host buffer is longer than the device buffer (the host
/// buffer is then dropped: nothing was enqueued); driver errors when enqueuing or waiting fails
/// (the host buffer is then dropped once the stream has passed the copy, or leaked).
///
/// # Cancel safety
/// Dropping the future before it resolves does not cancel the copy, and does not free the host
/// buffer under it: the buffer is handed to a host function enqueued on the same stream, which
/// drops it once the copy is done. If the copy then fails, its error goes to the device's
/// deferred errors ([`Device::take_deferred_error`](crate::Device::take_deferred_error)), since
/// no future is left to return it. `mem::forget` of the future leaks the host buffer and loses
/// such an error. Neither blocks.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mut buf = DeviceBuffer::new(4, &stream, CudaResource::new(&device)).await?;
/// let mine = buf.copy_from_host(vec![9u8, 8, 7]).await?; // the first 3 bytes
/// assert_eq!(mine, [9, 8, 7]);
/// assert_eq!(buf.copy_to_host(vec![0u8; 4]).await?, [9, 8, 7, 0]);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[must_use = "the copy is enqueued, but its host buffer comes back only by awaiting the future"]
pub struct CopyFromHost<B: HostBuffer> {
    transfer: HostTransfer<B>,
}

impl<B: HostBuffer> CopyFromHost<B> {
    /// Enqueues a copy of all of `host` to the start of `dst` (`capacity` bytes) on `stream`.
    ///
    /// # Safety
    /// `dst..dst + capacity` is device memory that is freed, read or written by other streams
    /// only after work on `stream` enqueued now has completed.
    pub(crate) unsafe fn start(stream: &Stream, dst: DevicePtr, capacity: usize, host: B) -> Self {
        let bytes = host.byte_len();
        if bytes > capacity {
            let e = Error::invalid(format!(
                "copy_from_host: the host buffer holds {bytes} bytes, the device buffer only \
                 {capacity}"
            ));
            return CopyFromHost {
                transfer: HostTransfer::ready(Err(e), bytes),
            };
        }
        let transfer = HostTransfer::start(stream, host, bytes, |src| {
            // SAFETY: `src` is the start of the host buffer, `bytes` long, owned by the transfer
            // until an event after this copy completes; `dst` holds at least `bytes` (checked
            // above) and is not accessed concurrently by this function's contract.
            unsafe { stream.raw().copy_pageable(dst.addr(), src, bytes, false) }
        });
        CopyFromHost { transfer }
    }

    /// A future that resolves to `error`; the host buffer was never taken.
    pub(crate) fn failed(error: Error) -> Self {
        CopyFromHost {
            transfer: HostTransfer::ready(Err(error), 0),
        }
    }
}

impl<B: HostBuffer> Future for CopyFromHost<B> {
    type Output = Result<B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<B>> {
        self.get_mut().transfer.poll_transfer(cx)
    }
}

impl<B: HostBuffer> fmt::Debug for CopyFromHost<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CopyFromHost")
            .field("transfer", &self.transfer)
            .finish()
    }
}

#[cfg(test)]
mod tests;
