//! Host kernels: closures that a host-backend stream runs in stream order on `&[T]` / `&mut [T]`
//! views of emulated device memory, tracked like a device kernel's arguments.
//!
//! The host backend's counterpart of a kernel launch, so the same pipeline runs in CI, in doc
//! examples and on a laptop: [`Stream::launch_host_kernel`] takes arguments made by
//! [`DeviceVec::host_read`] / [`DeviceVec::host_write`] (and the methods of the same names on
//! views and on [`DeviceBuffer`]), orders each like a device kernel's, and enqueues the
//! closure. The worker of the stream calls it when the stream reaches it.
//!
//! Why it is sound:
//! - An argument borrows its buffer (`&` for a read, `&mut` for a write) until the launch, so
//!   the buffer cannot be written, handed on or dropped while the launch tracks it, and two
//!   arguments of one launch cannot alias a write (the borrow checker refuses
//!   `(v.host_read(), v.host_write())`).
//! - After the launch, stream order keeps the memory alive and unaliased: a write argument's
//!   buffer is handed to the launch stream (its later work and its free come after the
//!   kernel); a read argument's launch stream is a pending reader of the buffer, so the
//!   owner's next write, hand-off or free waits for the kernel, even if everything else is
//!   forgotten.
//! - The closure is `Send + 'static` and receives the slices for a lifetime of its call only
//!   (`for<'k> FnOnce(views<'k>)`): nothing it returns or stores can reach them afterwards.

use std::borrow::Borrow;
use std::fmt;
use std::marker::PhantomData;
use std::panic::{self, AssertUnwindSafe};

use bytemuck::Pod;

use super::byte_range::{elements, ByteRange, ByteRangeMut};
use super::device_buffer::DeviceBuffer;
use super::vec::{DeviceVec, VecView, VecViewMut};
use super::view::BufferView;
use crate::backend::panic_message;
use crate::error::{Error, Result};
use crate::ids::BackendKind;
use crate::stream::Stream;

/// A read argument of a host kernel: the kernel receives `&[T]`. Made by
/// [`DeviceVec::host_read`], [`VecView::host_read`], [`VecViewMut::host_read`],
/// [`DeviceBuffer::host_read`] and [`BufferView::host_read`].
///
/// It borrows its buffer until [`Stream::launch_host_kernel`] consumes it, so the buffer
/// cannot be written or dropped before the launch has ordered it.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
///
/// let device = Device::host();
/// let stream = Stream::new(&device)?;
/// let buf = DeviceBuffer::try_new(16, &stream, CudaResource::new(&device)?)?;
/// let arg = buf.host_read();
/// assert_eq!(arg.len(), 16);
/// stream.launch_host_kernel(arg, |bytes: &[u8]| assert!(bytes.iter().all(|&b| b == 0)))?;
/// # stream.synchronize_blocking()?;
/// # assert!(device.take_deferred_error().is_none());
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[must_use = "a host kernel argument does nothing until it is passed to `launch_host_kernel`"]
pub struct HostRead<'a, T> {
    buf: &'a DeviceBuffer,
    /// Byte offset of the first element from `buf.ptr()`.
    offset: usize,
    /// Elements.
    len: usize,
    _elem: PhantomData<&'a [T]>,
}

/// A write argument of a host kernel: the kernel receives `&mut [T]`. Made by
/// [`DeviceVec::host_write`], [`VecViewMut::host_write`] and [`DeviceBuffer::host_write`].
///
/// It borrows its buffer mutably until [`Stream::launch_host_kernel`] consumes it; the launch
/// hands the buffer to the launch stream ([`DeviceBuffer::set_stream`]), as a device kernel
/// that writes it would need.
///
/// # Examples
///
/// ```
/// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
///
/// # futures::executor::block_on(async {
/// let device = Device::host();
/// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
/// let mut buf = DeviceBuffer::new(4, &a, CudaResource::new(&device)?).await?;
/// b.launch_host_kernel(buf.host_write(), |bytes: &mut [u8]| bytes.fill(9))?;
/// assert_eq!(buf.stream(), b); // handed to the launch stream
/// assert_eq!(buf.copy_to_host(vec![0u8; 4]).await?, [9; 4]);
/// # Ok::<(), streamalloc::Error>(())
/// # }).unwrap();
/// ```
#[must_use = "a host kernel argument does nothing until it is passed to `launch_host_kernel`"]
pub struct HostWrite<'a, T> {
    buf: &'a mut DeviceBuffer,
    /// Byte offset of the first element from `buf.ptr()`.
    offset: usize,
    /// Elements.
    len: usize,
    _elem: PhantomData<&'a mut [T]>,
}

impl<'a, T: Pod> HostRead<'a, T> {
    /// `len` elements of `T` at byte `offset` of `buf`.
    ///
    /// The caller (a container or view of this crate) keeps `offset + len * size_of::<T>()`
    /// within `buf.len()`; the launch checks it again before any access.
    pub(crate) fn new(buf: &'a DeviceBuffer, offset: usize, len: usize) -> Self {
        HostRead {
            buf,
            offset,
            len,
            _elem: PhantomData,
        }
    }

    /// The elements of `T` in `bytes`, a container's or view's range.
    pub(crate) fn of(bytes: ByteRange<'a>) -> Self {
        Self::new(bytes.buffer(), bytes.offset(), elements::<T>(bytes.len()))
    }

    /// The number of elements the kernel will see.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(8, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(buf.host_read().len(), 8);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the kernel will see an empty slice.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(0, &stream, CudaResource::new(&device)?)?;
    /// assert!(buf.host_read().is_empty());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<'a, T: Pod> HostWrite<'a, T> {
    /// `len` elements of `T` at byte `offset` of `buf`; as [`HostRead::new`].
    pub(crate) fn new(buf: &'a mut DeviceBuffer, offset: usize, len: usize) -> Self {
        HostWrite {
            buf,
            offset,
            len,
            _elem: PhantomData,
        }
    }

    /// The elements of `T` in `bytes`, a container's or view's range.
    pub(crate) fn of(bytes: ByteRangeMut<'a>) -> Self {
        let (buf, offset, len) = bytes.into_parts();
        Self::new(buf, offset, elements::<T>(len))
    }

    /// The number of elements the kernel will see.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::try_new(8, &stream, CudaResource::new(&device)?)?;
    /// assert_eq!(buf.host_write().len(), 8);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the kernel will see an empty slice.
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    /// # let device = Device::host();
    /// # let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::try_new(0, &stream, CudaResource::new(&device)?)?;
    /// assert!(buf.host_write().is_empty());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl DeviceBuffer {
    /// The buffer's bytes as a read argument of a host kernel ([`Stream::launch_host_kernel`]):
    /// the kernel receives `&[u8]`.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mut buf = DeviceBuffer::try_new(4, &stream, CudaResource::new(&device)?)?;
    /// buf.fill(2)?;
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// stream.launch_host_kernel(buf.host_read(), move |b: &[u8]| {
    ///     tx.send(b.iter().map(|&x| x as u32).sum::<u32>()).unwrap()
    /// })?;
    /// assert_eq!(rx.recv().unwrap(), 8);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn host_read(&self) -> HostRead<'_, u8> {
        HostRead::of(ByteRange::whole(self))
    }

    /// The buffer's bytes as a write argument of a host kernel ([`Stream::launch_host_kernel`]):
    /// the kernel receives `&mut [u8]`, and the launch hands the buffer to its stream.
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
    /// stream.launch_host_kernel(buf.host_write(), |b: &mut [u8]| {
    ///     for (i, x) in b.iter_mut().enumerate() {
    ///         *x = i as u8;
    ///     }
    /// })?;
    /// assert_eq!(buf.copy_to_host(vec![0u8; 4]).await?, [0, 1, 2, 3]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn host_write(&mut self) -> HostWrite<'_, u8> {
        HostWrite::of(ByteRangeMut::whole(self))
    }
}

impl BufferView<'_> {
    /// The view's bytes as a read argument of a host kernel ([`Stream::launch_host_kernel`]).
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceBuffer, Stream};
    ///
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device)?)?;
    /// stream.launch_host_kernel(buf.slice(8..16)?.host_read(), |b: &[u8]| assert_eq!(b.len(), 8))?;
    /// # stream.synchronize_blocking()?;
    /// # assert!(device.take_deferred_error().is_none());
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn host_read(&self) -> HostRead<'_, u8> {
        HostRead::of(*self.bytes())
    }
}

impl<T: Pod> DeviceVec<T> {
    /// The vector as a read argument of a host kernel ([`Stream::launch_host_kernel`]): the
    /// kernel receives `&[T]`.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let v = DeviceVec::from_host(vec![1.5f32, 2.5], &stream, CudaResource::new(&device)?).await?;
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// stream.launch_host_kernel(v.host_read(), move |v: &[f32]| tx.send(v.iter().sum::<f32>()).unwrap())?;
    /// assert_eq!(rx.recv().unwrap(), 4.0);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn host_read(&self) -> HostRead<'_, T> {
        HostRead::of(ByteRange::whole(self.as_buffer()))
    }

    /// The vector as a write argument of a host kernel ([`Stream::launch_host_kernel`]): the
    /// kernel receives `&mut [T]`, and the launch hands the vector to its stream.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<u32>::new(4, &stream, CudaResource::new(&device)?).await?;
    /// stream.launch_host_kernel(v.host_write(), |v: &mut [u32]| {
    ///     v.iter_mut().enumerate().for_each(|(i, x)| *x = i as u32 * 10)
    /// })?;
    /// assert_eq!(v.to_vec().await?, [0, 10, 20, 30]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn host_write(&mut self) -> HostWrite<'_, T> {
        HostWrite::of(ByteRangeMut::whole(self.buffer_mut()))
    }
}

impl<'a, T: Pod> VecView<'a, T> {
    /// The view as a read argument of a host kernel ([`Stream::launch_host_kernel`]): the
    /// kernel receives `&[T]` of the view's elements; the whole vector is tracked as read.
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let v = DeviceVec::from_host(vec![1u16, 2, 3, 4], &stream, CudaResource::new(&device)?).await?;
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// stream.launch_host_kernel(v.slice(1..3)?.host_read(), move |s: &[u16]| tx.send(s.to_vec()).unwrap())?;
    /// assert_eq!(rx.recv().unwrap(), [2, 3]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn host_read(&self) -> HostRead<'a, T> {
        HostRead::of(*self.bytes())
    }
}

impl<T: Pod> VecViewMut<'_, T> {
    /// The view as a read argument of a host kernel; as [`VecView::host_read`].
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::from_host(vec![1u8, 2, 3], &stream, CudaResource::new(&device)?).await?;
    /// let view = v.slice_mut(1..)?;
    /// stream.launch_host_kernel(view.host_read(), |s: &[u8]| assert_eq!(s, [2, 3]))?;
    /// # stream.synchronize_blocking()?;
    /// # assert!(device.take_deferred_error().is_none());
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn host_read(&self) -> HostRead<'_, T> {
        HostRead::of(self.bytes().as_range())
    }

    /// The view as a write argument of a host kernel ([`Stream::launch_host_kernel`]): the
    /// kernel receives `&mut [T]` of the view's elements, and the launch hands the whole
    /// vector to its stream (as a device kernel writing the view needs).
    ///
    /// ```
    /// use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let stream = Stream::new(&device)?;
    /// let mut v = DeviceVec::<i32>::zeroed(5, &stream, CudaResource::new(&device)?).await?;
    /// stream.launch_host_kernel(v.slice_mut(1..4)?.host_write(), |s: &mut [i32]| s.fill(-1))?;
    /// assert_eq!(v.to_vec().await?, [0, -1, -1, -1, 0]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn host_write(&mut self) -> HostWrite<'_, T> {
        HostWrite::of(self.bytes_mut().reborrow())
    }
}

/// The arguments of a host kernel: a [`HostRead`], a [`HostWrite`], or a tuple of arguments
/// (up to 8, nested tuples too).
///
/// Sealed: only this crate's argument types implement it, because the launch trusts them to
/// describe memory that stream order keeps valid.
pub trait HostKernelArgs: sealed::Args {
    /// The shape of the views the kernel receives: see [`HostKernelViews`].
    type Shape: HostKernelViews;
}

/// What a host kernel receives for arguments of a given shape:
/// [`Views<'k>`](HostKernelViews::Views) is `&'k [T]` for a [`HostRead<T>`], `&'k mut [T]`
/// for a [`HostWrite<T>`], and the tuple of those for a tuple of arguments. `'k` is the
/// kernel's call: the views cannot outlive it.
///
/// Sealed, as [`HostKernelArgs`].
pub trait HostKernelViews: sealed::Sealed + 'static {
    /// The views for one call of the kernel.
    type Views<'k>;

    /// The kernel's views of the next arguments of `raw` (host address, elements).
    ///
    /// # Safety
    /// 1. `raw` yields what [`HostKernelArgs`]' preparation of arguments of this shape
    ///    appended, in order, on a stream that has now reached the kernel.
    /// 2. The views are used only during the `'k` call of the kernel.
    #[doc(hidden)]
    unsafe fn views<'k>(raw: &mut std::slice::Iter<'k, RawSlice>) -> Self::Views<'k>;
}

/// The 'static shape of a [`HostRead<T>`] (a read of `[T]`).
#[derive(Debug)]
pub struct ReadShape<T>(PhantomData<fn() -> T>);

/// The 'static shape of a [`HostWrite<T>`] (a write of `[T]`).
#[derive(Debug)]
pub struct WriteShape<T>(PhantomData<fn() -> T>);

/// One argument's memory as the kernel's worker sees it: a host address and a length in
/// elements. Plain numbers, so the enqueued closure is `Send + 'static`.
type RawSlice = (u64, usize);

mod sealed {
    use super::*;

    /// Keeps [`HostKernelViews`] to this crate's shapes.
    pub trait Sealed {}

    pub trait Args {
        /// Checks what can be checked before anything is tracked: the device, the range, the
        /// alignment.
        fn check(&self, stream: &Stream) -> Result<()>;
        /// Orders the argument's buffer for a kernel on `stream` (reads: pending reader;
        /// writes: hand-off) and appends its memory to `out`, in argument order.
        fn prepare(self, stream: &Stream, out: &mut Vec<RawSlice>) -> Result<()>;
    }
}

/// Checks that `len` elements of `T` at byte `offset` lie inside `buf` and are aligned for `T`;
/// returns their address.
fn check_slice<T>(buf: &DeviceBuffer, stream: &Stream, offset: usize, len: usize) -> Result<u64> {
    stream.check_on(
        buf.device(),
        "a host kernel's buffer argument, on its launch stream",
    )?;
    let bytes = len
        .checked_mul(size_of::<T>())
        .and_then(|b| b.checked_add(offset))
        .filter(|&end| end <= buf.len());
    if bytes.is_none() {
        return Err(Error::invalid(format!(
            "host kernel argument: {len} elements of {} bytes at byte {offset} do not fit in \
             a buffer of {} bytes",
            size_of::<T>(),
            buf.len()
        )));
    }
    let addr = buf.ptr.addr() + offset as u64;
    if len > 0 && addr % align_of::<T>() as u64 != 0 {
        return Err(Error::invalid(format!(
            "host kernel argument: address {addr:#x} is not aligned to {} bytes for its \
             element type",
            align_of::<T>()
        )));
    }
    Ok(addr)
}

/// [`check_slice`], then `order` for the buffer (the kernel's read or hand-off), then the
/// slice's memory appended to `out`: a slice argument's `prepare`, read or write.
fn prepare_slice<T, B: Borrow<DeviceBuffer>>(
    buf: B,
    stream: &Stream,
    offset: usize,
    len: usize,
    out: &mut Vec<RawSlice>,
    order: impl FnOnce(B) -> Result<()>,
) -> Result<()> {
    let addr = check_slice::<T>(buf.borrow(), stream, offset, len)?;
    order(buf)?;
    out.push((addr, len));
    Ok(())
}

/// The memory of the next argument, which `prepare` pushed; `None` for an empty slice (its
/// address need not be one a slice may have).
fn next_slice(raw: &mut std::slice::Iter<'_, RawSlice>) -> Option<RawSlice> {
    let &(addr, len) = raw.next().expect("one raw slice per argument");
    (len > 0).then_some((addr, len))
}

impl<T: Pod> sealed::Args for HostRead<'_, T> {
    fn check(&self, stream: &Stream) -> Result<()> {
        check_slice::<T>(self.buf, stream, self.offset, self.len).map(drop)
    }

    fn prepare(self, stream: &Stream, out: &mut Vec<RawSlice>) -> Result<()> {
        let order = |buf: &DeviceBuffer| buf.begin_read(stream);
        prepare_slice::<T, _>(self.buf, stream, self.offset, self.len, out, order)
    }
}

impl<T: Pod> sealed::Args for HostWrite<'_, T> {
    fn check(&self, stream: &Stream) -> Result<()> {
        check_slice::<T>(self.buf, stream, self.offset, self.len).map(drop)
    }

    fn prepare(self, stream: &Stream, out: &mut Vec<RawSlice>) -> Result<()> {
        let order = |buf: &mut DeviceBuffer| buf.take_for(stream);
        prepare_slice::<T, _>(self.buf, stream, self.offset, self.len, out, order)
    }
}

impl<T: Pod> HostKernelArgs for HostRead<'_, T> {
    type Shape = ReadShape<T>;
}

impl<T: Pod> HostKernelArgs for HostWrite<'_, T> {
    type Shape = WriteShape<T>;
}

impl<T: Pod> sealed::Sealed for ReadShape<T> {}
impl<T: Pod> sealed::Sealed for WriteShape<T> {}

impl<T: Pod> HostKernelViews for ReadShape<T> {
    type Views<'k> = &'k [T];

    unsafe fn views<'k>(raw: &mut std::slice::Iter<'k, RawSlice>) -> &'k [T] {
        let Some((addr, len)) = next_slice(raw) else {
            return &[];
        };
        // SAFETY: `prepare` checked that `len` elements of `T` at `addr` lie in the buffer and
        // are aligned. The launch runs only on the host backend, whose device code is host
        // code, and the buffer's resource promised (`MemoryResource` is an unsafe trait) that
        // the range is memory its device may use, the buffer's alone while allocated: host
        // memory here. It is initialised (the host backend zeroes it at allocation), and
        // `T: Pod` makes any bytes a valid `T`. The launch stream reached the
        // kernel after the owner's writes so far (`begin_read`), and the owner's next write,
        // hand-off and free wait for the launch stream past this call (pending reader): no
        // write overlaps the call, and the memory stays allocated through it (caller's 1, 2).
        unsafe { std::slice::from_raw_parts(addr as *const T, len) }
    }
}

impl<T: Pod> HostKernelViews for WriteShape<T> {
    type Views<'k> = &'k mut [T];

    unsafe fn views<'k>(raw: &mut std::slice::Iter<'k, RawSlice>) -> &'k mut [T] {
        let Some((addr, len)) = next_slice(raw) else {
            return &mut [];
        };
        // SAFETY: as for reads, and: the buffer was handed to the launch stream, which waited
        // for every earlier owner's work and every recorded or pending read; the buffer's later
        // work is enqueued on this stream (after this call) or on a stream that a hand-off or
        // read makes wait for it. The launch borrowed the buffer mutably, so no other argument
        // of this kernel views it. Nothing else accesses the range during the call.
        unsafe { std::slice::from_raw_parts_mut(addr as *mut T, len) }
    }
}

macro_rules! tuple_args {
    ($($name:ident),+) => {
        impl<$($name: HostKernelArgs),+> sealed::Args for ($($name,)+) {
            fn check(&self, stream: &Stream) -> Result<()> {
                #[allow(non_snake_case)]
                let ($($name,)+) = self;
                $(sealed::Args::check($name, stream)?;)+
                Ok(())
            }

            fn prepare(self, stream: &Stream, out: &mut Vec<RawSlice>) -> Result<()> {
                #[allow(non_snake_case)]
                let ($($name,)+) = self;
                $(sealed::Args::prepare($name, stream, out)?;)+
                Ok(())
            }
        }

        impl<$($name: HostKernelArgs),+> HostKernelArgs for ($($name,)+) {
            type Shape = ($($name::Shape,)+);
        }

        impl<$($name: HostKernelViews),+> sealed::Sealed for ($($name,)+) {}

        impl<$($name: HostKernelViews),+> HostKernelViews for ($($name,)+) {
            type Views<'k> = ($($name::Views<'k>,)+);

            unsafe fn views<'k>(raw: &mut std::slice::Iter<'k, RawSlice>) -> Self::Views<'k> {
                // SAFETY: forwarded from the caller; the elements take the raw slices in
                // argument order, as `prepare` appended them.
                unsafe { ($($name::views(raw),)+) }
            }
        }
    };
}

tuple_args!(A);
tuple_args!(A, B);
tuple_args!(A, B, C);
tuple_args!(A, B, C, D);
tuple_args!(A, B, C, D, E);
tuple_args!(A, B, C, D, E, F);
tuple_args!(A, B, C, D, E, F, G);
tuple_args!(A, B, C, D, E, F, G, H);

impl Stream {
    /// Enqueues a host kernel: `kernel` runs on this stream's worker when the stream reaches
    /// it, with `&[T]` for each [`HostRead`] and `&mut [T]` for each [`HostWrite`] of `args`
    /// (a single argument or a tuple of them). The host backend's counterpart of a device
    /// kernel launch, tracked the same way, so pipeline code runs unchanged in CI.
    ///
    /// Annotate the closure's parameter types (`|(a, c): (&[f32], &mut [f32])|`) or let them
    /// be inferred from `args`: both work.
    ///
    /// # Stream ordering
    /// - Read arguments: this stream first waits for the owner's work so far on each buffer,
    ///   and becomes a reader of it; the owner's next write, hand-off and free wait for the
    ///   kernel (also when every handle here is forgotten).
    /// - Write arguments: each buffer is handed to this stream
    ///   ([`DeviceBuffer::set_stream`]): the kernel runs after the old owner's work and every
    ///   read, and the buffer's later work and free are enqueued after it.
    /// - Like any host function, the kernel occupies the stream while it runs.
    ///
    /// # Errors
    /// Before anything is enqueued or tracked:
    /// - [`Error::Unsupported`] on a stream that is not of the host backend: CUDA device
    ///   memory is not host-accessible (launch a device kernel through the cudarc interop
    ///   instead);
    /// - [`Error::DeviceMismatch`] when an argument's buffer is on another device than this
    ///   stream;
    /// - [`Error::InvalidArgument`] when an argument's range lies outside its buffer or is not
    ///   aligned for its element type.
    ///
    /// Driver errors while ordering or enqueuing (the arguments then may already be ordered,
    /// which only adds waits).
    ///
    /// # Panics
    /// A panic inside `kernel` does not unwind into the stream's worker: it is caught and
    /// reported as a deferred error of the device ([`Device::take_deferred_error`]), and the
    /// stream goes on with its later work. What the kernel wrote before panicking stays
    /// written.
    ///
    /// [`Device::take_deferred_error`]: crate::Device::take_deferred_error
    ///
    /// # Examples
    ///
    /// `c = a * x + b` on typed vectors, the closure's parameter types inferred from `args`;
    /// a kernel on stream `b` that reads a vector written on `a` waits for `a`:
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    ///
    /// # futures::executor::block_on(async {
    /// let device = Device::host();
    /// let mr = CudaResource::new(&device)?;
    /// let (a, b) = (Stream::new(&device)?, Stream::new(&device)?);
    /// let mut x = DeviceVec::<f32>::new(4, &a, mr.clone()).await?;
    /// let y = DeviceVec::from_host(vec![1.0f32; 4], &b, mr.clone()).await?;
    /// let mut c = DeviceVec::<f32>::new(4, &b, mr).await?;
    /// a.enqueue_delay(Duration::from_millis(20))?; // a long kernel on `a` ...
    /// a.launch_host_kernel(x.host_write(), |x: &mut [f32]| x.fill(3.0))?; // ... then x = 3
    ///
    /// // On `b`: waits for `a`'s write of `x`.
    /// b.launch_host_kernel((x.host_read(), y.host_read(), c.host_write()), |(x, y, c)| {
    ///     for ((c, x), y) in c.iter_mut().zip(x).zip(y) {
    ///         *c = 2.0 * x + y;
    ///     }
    /// })?;
    /// drop(x); // freed on `a` after `b`'s kernel has read it
    /// assert_eq!(c.to_vec().await?, [7.0; 4]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    ///
    /// With the parameter types written out (handy in a helper generic over the element):
    ///
    /// ```
    /// # use streamalloc::{CudaResource, Device, DeviceVec, Stream};
    /// # futures::executor::block_on(async {
    /// # let device = Device::host();
    /// # let s = Stream::new(&device)?;
    /// let a = DeviceVec::from_host(vec![1u64, 2, 3], &s, CudaResource::new(&device)?).await?;
    /// let mut sum = DeviceVec::<u64>::zeroed(1, &s, CudaResource::new(&device)?).await?;
    /// s.launch_host_kernel((a.host_read(), sum.host_write()), |(a, sum): (&[u64], &mut [u64])| {
    ///     sum[0] = a.iter().sum()
    /// })?;
    /// assert_eq!(sum.to_vec().await?, [6]);
    /// # Ok::<(), streamalloc::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn launch_host_kernel<A, F>(&self, args: A, kernel: F) -> Result<()>
    where
        A: HostKernelArgs,
        F: for<'k> FnOnce(<A::Shape as HostKernelViews>::Views<'k>) + Send + 'static,
    {
        let device = self.device().clone();
        if device.backend() != BackendKind::Host {
            return Err(Error::unsupported(
                "launch_host_kernel: device memory is not host-accessible; launch a device \
                 kernel through the cudarc interop instead",
                device.id(),
            ));
        }
        sealed::Args::check(&args, self)?;
        let mut raw = Vec::new();
        sealed::Args::prepare(args, self, &mut raw)?;
        let stream = self.id();
        self.launch_host_fn(move || {
            let mut slices = raw.iter();
            // SAFETY: `raw` is what `prepare` appended for `args`, whose shape is `A::Shape`;
            // this host function runs when the stream reaches it, and the views go only to
            // this call of `kernel`, which cannot keep them (`for<'k>`).
            let views = unsafe { A::Shape::views(&mut slices) };
            if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(move || kernel(views))) {
                device.defer_error(Error::invalid(format!(
                    "a host kernel panicked on {stream} of {}: {}; the stream went on",
                    device.id(),
                    panic_message(&*payload)
                )));
            }
        })
    }
}

impl<T> fmt::Debug for HostRead<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_slice(f, "HostRead", self.buf, self.offset, self.len)
    }
}

impl<T> fmt::Debug for HostWrite<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_slice(f, "HostWrite", self.buf, self.offset, self.len)
    }
}

/// A slice argument's `Debug`, read or write alike.
fn debug_slice(
    f: &mut fmt::Formatter<'_>,
    name: &str,
    buf: &DeviceBuffer,
    offset: usize,
    len: usize,
) -> fmt::Result {
    f.debug_struct(name)
        .field("ptr", &buf.ptr)
        .field("offset", &offset)
        .field("len", &len)
        .finish()
}

#[cfg(all(test, feature = "gpu-tests"))]
mod gpu_tests;
#[cfg(test)]
mod tests;
