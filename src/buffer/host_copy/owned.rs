//! Host↔device copies that own their host buffer until the device is done with it: the
//! host buffers they take, the transfer that holds one, and the two futures.

use std::fmt;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Wake, Waker};

use bytemuck::Pod;

use crate::error::{Error, Result};
use crate::resource::DevicePtr;
use crate::stream::{Event, Stream};

pub(in crate::buffer) mod sealed {
    use crate::stream::Stream;

    /// Takes an owned host buffer apart and puts it back together. Private: only the types
    /// listed in this crate may be [`HostBuffer`](super::HostBuffer)s.
    pub trait Sealed: Sized {
        /// The buffer taken apart: it owns the memory but never frees it when dropped (a
        /// dropped `Raw` leaks), the safe default when it is unknown whether the device is done.
        type Raw: Send + 'static;

        /// The number of bytes the buffer holds.
        fn byte_len(&self) -> usize;

        /// The number of elements the buffer holds.
        fn elem_len(&self) -> usize;

        /// Whether the device's copy engines reach the memory directly (page-locked or managed
        /// memory): a copy then goes straight to the driver's async copy, which returns at once;
        /// pageable memory is staged by the CUDA backend instead.
        fn page_locked(&self) -> bool;

        /// Gives up ownership. The address stays valid until `from_raw` rebuilds the value.
        fn into_raw(self) -> Self::Raw;

        /// The address of the first byte.
        fn raw_addr(raw: &Self::Raw) -> u64;

        /// Rebuilds the value.
        ///
        /// # Safety
        /// 1. `raw` came from `into_raw` of `Self`.
        /// 2. The device no longer accesses the bytes.
        unsafe fn from_raw(raw: Self::Raw) -> Self;

        /// Frees the buffer once `stream` has passed every copy enqueued on it so far, without
        /// blocking on the device where it can, and without freeing under the device if that
        /// cannot be arranged (it leaks instead, and defers the error to the device).
        ///
        /// # Safety
        /// 1. `raw` came from `into_raw` of `Self`.
        /// 2. Every device access to the bytes is ordered before this point of `stream`.
        unsafe fn release_after(raw: Self::Raw, stream: &Stream);
    }
}

/// Host memory that an async copy may own while the device reads or writes it: `Vec<T>`,
/// `Box<[T]>` and [`PinnedHostVec<T>`](crate::PinnedHostVec), for any [`bytemuck::Pod`]
/// element type `T`.
///
/// Each keeps its elements on the heap, so the address the device uses does not change when the
/// value moves into and out of a copy future. Lengths are `len * size_of::<T>()` bytes; copies
/// move bytes, so a `Vec<f32>` receives a buffer's bytes with no conversion. The trait is
/// sealed: arrays and other types whose bytes move with the value (or that are not uniquely
/// owned) cannot implement it.
///
/// A `Vec` or `Box` is pageable memory: on CUDA the copy is staged through the stream's own
/// page-locked buffer. A [`PinnedHostVec`](crate::PinnedHostVec) is copied directly, truly
/// asynchronously.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, DeviceVec, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mut v = DeviceVec::<f32>::new(4, &stream, CudaResource::new(&device)?).await?;
/// let boxed: Box<[f32]> = vec![1.0, 2.0, 3.0, 4.0].into_boxed_slice();
/// let boxed = v.copy_from_host(boxed).await?;        // handed back when the copy is done
/// let back = v.copy_to_host(vec![0f32; 4]).await?;
/// assert_eq!(&back[..], &boxed[..]);
/// let buf: DeviceBuffer = v.into();                  // a buffer's copies are bytes
/// let bytes = buf.copy_to_host(vec![0u8; 16]).await?;
/// assert_eq!(bytes, bytemuck::cast_slice::<f32, u8>(&boxed));
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
pub trait HostBuffer: sealed::Sealed + Send + 'static {
    /// The element type; the buffer holds `len` of them, `len * size_of::<Elem>()` bytes.
    type Elem: Pod;
}

/// A `Vec<T>` or `Box<[T]>` taken apart: address, length and capacity in elements.
#[derive(Debug)]
pub struct RawHeap<T> {
    ptr: *mut T,
    len: usize,
    cap: usize,
}

// SAFETY: a `RawHeap<T>` is the unique owner of a `Vec<T>`'s or `Box<[T]>`'s elements (it was
// taken apart by value); sending it sends that ownership, which is sound because `T: Send`.
unsafe impl<T: Send> Send for RawHeap<T> {}

/// Hands the value rebuilt from `raw` to a host function on `stream`, which drops it once the
/// stream has passed every copy enqueued on it so far. If that cannot be enqueued the value is
/// leaked, never freed under the device. Never blocks. Only for buffers whose drop makes no
/// driver call (host functions must not call the driver).
///
/// # Safety
/// As [`Sealed::release_after`](sealed::Sealed::release_after).
unsafe fn drop_in_host_fn<B: sealed::Sealed>(raw: B::Raw, stream: &Stream) {
    let release = move || {
        // SAFETY: this host function runs once `stream` has reached it, after every device
        // access to the bytes (the caller's contract, 2); `raw` came from `B::into_raw` (1).
        drop(unsafe { B::from_raw(raw) });
    };
    if let Err(e) = stream.launch_host_fn(release) {
        // The closure, and with it the raw parts, is dropped: the buffer leaks.
        tracing::warn!(error = %e, "leaking a host buffer whose copy may still be running");
        stream.device().defer_error(e);
    }
}

impl<T: Pod + Send> sealed::Sealed for Vec<T> {
    type Raw = RawHeap<T>;

    fn byte_len(&self) -> usize {
        std::mem::size_of_val(self.as_slice())
    }

    fn elem_len(&self) -> usize {
        self.len()
    }

    fn page_locked(&self) -> bool {
        false
    }

    fn into_raw(self) -> RawHeap<T> {
        let mut v = ManuallyDrop::new(self);
        RawHeap {
            ptr: v.as_mut_ptr(),
            len: v.len(),
            cap: v.capacity(),
        }
    }

    fn raw_addr(raw: &RawHeap<T>) -> u64 {
        raw.ptr as u64
    }

    unsafe fn from_raw(raw: RawHeap<T>) -> Self {
        // SAFETY: by the caller's contract the parts came from `into_raw` above, i.e. from a
        // `Vec<T>` that was never dropped; length and capacity are in elements, as taken.
        unsafe { Vec::from_raw_parts(raw.ptr, raw.len, raw.cap) }
    }

    unsafe fn release_after(raw: RawHeap<T>, stream: &Stream) {
        // SAFETY: forwarded from the caller; dropping a `Vec` makes no driver call.
        unsafe { drop_in_host_fn::<Self>(raw, stream) }
    }
}

impl<T: Pod + Send> HostBuffer for Vec<T> {
    type Elem = T;
}

impl<T: Pod + Send> sealed::Sealed for Box<[T]> {
    type Raw = RawHeap<T>;

    fn byte_len(&self) -> usize {
        std::mem::size_of_val(&**self)
    }

    fn elem_len(&self) -> usize {
        self.len()
    }

    fn page_locked(&self) -> bool {
        false
    }

    fn into_raw(self) -> RawHeap<T> {
        let len = self.len();
        RawHeap {
            ptr: Box::into_raw(self).cast::<T>(),
            len,
            cap: len,
        }
    }

    fn raw_addr(raw: &RawHeap<T>) -> u64 {
        raw.ptr as u64
    }

    unsafe fn from_raw(raw: RawHeap<T>) -> Self {
        // SAFETY: by the caller's contract the parts came from `Box::into_raw` of a `Box<[T]>`
        // of `len` elements, rebuilt once.
        unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(raw.ptr, raw.len)) }
    }

    unsafe fn release_after(raw: RawHeap<T>, stream: &Stream) {
        // SAFETY: forwarded from the caller; dropping a `Box` makes no driver call.
        unsafe { drop_in_host_fn::<Self>(raw, stream) }
    }
}

impl<T: Pod + Send> HostBuffer for Box<[T]> {
    type Elem = T;
}

/// A host buffer taken apart while the device may access its bytes. Dropping it leaks the
/// buffer (see [`Sealed::Raw`](sealed::Sealed::Raw)).
struct RawHost<B: HostBuffer> {
    raw: B::Raw,
}

impl<B: HostBuffer> RawHost<B> {
    fn new(host: B) -> Self {
        RawHost {
            raw: host.into_raw(),
        }
    }

    fn addr(&self) -> u64 {
        B::raw_addr(&self.raw)
    }

    /// Rebuilds the buffer.
    ///
    /// # Safety
    /// The device no longer accesses the bytes: every copy enqueued on them has completed (or
    /// none was enqueued).
    unsafe fn reclaim(self) -> B {
        // SAFETY: the parts came from `B::into_raw` in `new` and `self` is consumed, so they
        // are used once; the caller guarantees the device is done with the bytes.
        unsafe { B::from_raw(self.raw) }
    }
}

/// Frees `host` once `stream` has passed every copy enqueued on it so far (or leaks it). Never
/// blocks on the device, except where the resource of a pinned buffer's own free does.
fn release_after<B: HostBuffer>(stream: &Stream, host: RawHost<B>) {
    // SAFETY: the raw parts came from `B::into_raw` (`RawHost::new`); every copy on the bytes
    // was enqueued on `stream` (the transfer's only stream) before this point.
    unsafe { B::release_after(host.raw, stream) }
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

enum State<B: HostBuffer> {
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

// Nothing is ever pinned through a transfer: its futures poll it by `&mut`, and the host
// buffer inside is moved out whole. So it is `Unpin` even for element types that are not.
impl<B: HostBuffer> Unpin for HostTransfer<B> {}

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

    /// The event recorded right after the copy, while it is in flight.
    fn done_event(&self) -> Option<Event> {
        match &self.state {
            State::InFlight { done, .. } => Some(done.clone()),
            State::Ready(_) => None,
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

/// How a copy counts the device side of its length check, and names it in the error: bytes for
/// a buffer and its byte views, elements for the typed containers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    Bytes,
    Elements,
}

impl Unit {
    /// The [`Error::LengthMismatch`] of a copy named `call` between `device_len` and `host_len`
    /// units.
    /// `T` is the host side's element type, which the message names.
    pub(crate) fn mismatch<T>(
        self,
        call: &'static str,
        device_len: usize,
        host_len: usize,
    ) -> Error {
        let unit = match self {
            Unit::Bytes => "bytes",
            Unit::Elements => "elements",
        };
        Error::LengthMismatch {
            call,
            element: std::any::type_name::<T>(),
            device_len,
            host_len,
            unit,
        }
    }
}

/// What the containers' one copy path needs of every copy future: the event recorded after
/// the copy (the buffer's last use, for a later hand-off) and a future that fails at once.
pub(crate) trait EnqueuedCopy: Sized {
    /// A future that resolves to `error`; nothing was enqueued and the host side was dropped.
    fn failed(error: Error) -> Self;

    /// The event recorded on the stream right after the copy (`None` when nothing was
    /// enqueued).
    fn done_event(&self) -> Option<Event>;
}

/// The parts [`CopyToHost`] and [`CopyFromHost`] share: each is a [`HostTransfer`] that differs
/// only in how it starts.
macro_rules! transfer_future {
    ($name:ident) => {
        impl<B: HostBuffer> EnqueuedCopy for $name<B> {
            fn failed(error: Error) -> Self {
                $name {
                    transfer: HostTransfer::ready(Err(error), 0),
                }
            }

            fn done_event(&self) -> Option<Event> {
                self.transfer.done_event()
            }
        }

        impl<B: HostBuffer> Future for $name<B> {
            type Output = Result<B>;

            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<B>> {
                self.get_mut().transfer.poll_transfer(cx)
            }
        }

        impl<B: HostBuffer> fmt::Debug for $name<B> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("transfer", &self.transfer)
                    .finish()
            }
        }
    };
}

/// The future of [`DeviceBuffer::copy_to_host`](crate::DeviceBuffer::copy_to_host): resolves to
/// the host buffer, its first `len()` bytes filled from the device buffer, once the copy has
/// completed.
///
/// The copy is enqueued on the buffer's owning stream when `copy_to_host` is called, not at the
/// first poll; the future only waits for an event recorded after it, without blocking a thread.
/// It borrows nothing: the device buffer may be handed on or dropped meanwhile, since its free
/// and every later write are ordered after the copy.
///
/// # Errors
/// [`Error::LengthMismatch`] when the host buffer is shorter than the device buffer (the host
/// buffer is then dropped: nothing was enqueued); driver errors when enqueuing or waiting fails
/// (the host buffer is then dropped once the stream has passed the copy, or leaked).
///
/// # Cancel safety
/// Dropping the future before it resolves does not cancel the copy, and does not free the host
/// buffer under it: the buffer is handed to a host function enqueued on the same stream, which
/// drops it once the copy is done. If the copy then fails, its error goes to the device's
/// deferred errors ([`Device::take_deferred_error`](crate::Device::take_deferred_error)), since
/// no future is left to return it. `mem::forget` of the future leaks the host buffer and loses
/// such an error. Neither blocks. A [`PinnedHostVec`](crate::PinnedHostVec) is not dropped in a
/// host function (its free may call the driver): it is freed at once, stream-ordered on the
/// copy's stream, after the copy; the leaf [`PinnedHostResource`](crate::PinnedHostResource)'s
/// free then waits for that stream (`cuMemFreeHost`), a pool's does not.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mut buf = DeviceBuffer::new(16, &stream, CudaResource::new(&device)?).await?;
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
    /// Enqueues a copy of `len` elements of `B::Elem` from `src` into the start of `host` on
    /// `stream`. A host buffer of fewer elements is an [`Error::LengthMismatch`] counted in
    /// `unit` (the host buffer is then dropped: nothing was enqueued).
    ///
    /// # Safety
    /// `src..src + len * size_of::<B::Elem>()` (a product that does not overflow) is device
    /// memory that is freed, and written by other streams, only after work on `stream` enqueued
    /// now has completed.
    pub(crate) unsafe fn start(
        unit: Unit,
        stream: &Stream,
        src: DevicePtr,
        len: usize,
        host: B,
    ) -> Self {
        let host_len = host.elem_len();
        if host_len < len {
            return Self::failed(unit.mismatch::<B::Elem>("copy_to_host", len, host_len));
        }
        let bytes = len * std::mem::size_of::<B::Elem>();
        let page_locked = host.page_locked();
        let transfer = HostTransfer::start(stream, host, bytes, |dst| {
            // SAFETY: `dst` is the start of the host buffer, at least `bytes` long (checked
            // above), owned by the transfer until an event after this copy completes; `src` is
            // valid and not written concurrently by this function's contract.
            unsafe {
                if page_locked {
                    stream.raw().copy(dst, src.addr(), bytes)
                } else {
                    stream.raw().copy_pageable(dst, src.addr(), bytes, true)
                }
            }
        });
        CopyToHost { transfer }
    }
}

transfer_future!(CopyToHost);

/// The future of [`DeviceBuffer::copy_from_host`](crate::DeviceBuffer::copy_from_host):
/// resolves to the host buffer, unchanged, once its bytes have been copied to the device.
///
/// The copy is enqueued on the buffer's owning stream when `copy_from_host` is called, not at
/// the first poll; the future only waits for an event recorded after it, without blocking a
/// thread. Work enqueued on the owning stream afterwards already sees the new bytes, whether or
/// not the future is awaited.
///
/// # Errors
/// [`Error::LengthMismatch`] when the host buffer is longer than the device buffer (the host
/// buffer is then dropped: nothing was enqueued); driver errors when enqueuing or waiting fails
/// (the host buffer is then dropped once the stream has passed the copy, or leaked).
///
/// # Cancel safety
/// Dropping the future before it resolves does not cancel the copy, and does not free the host
/// buffer under it: the buffer is handed to a host function enqueued on the same stream, which
/// drops it once the copy is done. If the copy then fails, its error goes to the device's
/// deferred errors ([`Device::take_deferred_error`](crate::Device::take_deferred_error)), since
/// no future is left to return it. `mem::forget` of the future leaks the host buffer and loses
/// such an error. Neither blocks. A [`PinnedHostVec`](crate::PinnedHostVec) is not dropped in a
/// host function (its free may call the driver): it is freed at once, stream-ordered on the
/// copy's stream, after the copy; the leaf [`PinnedHostResource`](crate::PinnedHostResource)'s
/// free then waits for that stream (`cuMemFreeHost`), a pool's does not.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let mut buf = DeviceBuffer::new(4, &stream, CudaResource::new(&device)?).await?;
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
    /// Enqueues a copy of all of `host` to the start of `dst`, room for `capacity` elements of
    /// `B::Elem`, on `stream`. A host buffer of more elements is an [`Error::LengthMismatch`]
    /// counted in `unit` (the host buffer is then dropped: nothing was enqueued).
    ///
    /// # Safety
    /// `dst..dst + capacity * size_of::<B::Elem>()` (a product that does not overflow) is device
    /// memory that is freed, read or written by other streams only after work on `stream`
    /// enqueued now has completed.
    pub(crate) unsafe fn start(
        unit: Unit,
        stream: &Stream,
        dst: DevicePtr,
        capacity: usize,
        host: B,
    ) -> Self {
        let host_len = host.elem_len();
        if host_len > capacity {
            return Self::failed(unit.mismatch::<B::Elem>("copy_from_host", capacity, host_len));
        }
        let bytes = host.byte_len();
        let page_locked = host.page_locked();
        let transfer = HostTransfer::start(stream, host, bytes, |src| {
            // SAFETY: `src` is the start of the host buffer, `bytes` long, owned by the transfer
            // until an event after this copy completes; `dst` holds at least `bytes` (checked
            // above) and is not accessed concurrently by this function's contract.
            unsafe {
                if page_locked {
                    stream.raw().copy(dst.addr(), src, bytes)
                } else {
                    stream.raw().copy_pageable(dst.addr(), src, bytes, false)
                }
            }
        });
        CopyFromHost { transfer }
    }
}

transfer_future!(CopyFromHost);
