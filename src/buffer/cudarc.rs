//! cudarc interop for buffers: cudarc's `DeviceSlice` / `DevicePtr` / `DevicePtrMut` and kernel
//! arguments (`PushKernelArg`), with every use tracked like the buffer's own operations. The
//! rules users see are in [`Stream::cudarc_stream`]'s docs ("Buffers in cudarc calls").

use std::sync::Arc;

use cudarc::driver::{
    sys, CudaStream, DevicePtr as CudarcDevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice,
    LaunchArgs, PushKernelArg, SyncOnDrop,
};

use bytemuck::Pod;

use super::byte_range::{ByteRange, ByteRangeMut};
use super::device_buffer::DeviceBuffer;
use super::guard::ReadGuard;
use super::scalar::DeviceScalar;
use super::vec::{DeviceVec, VecView, VecViewMut};
use crate::device::cudarc::driver_error;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ids::{BackendKind, DeviceId};
use crate::resource::DevicePtr;
use crate::stream::Stream;

// The kernel-argument impls push `&DevicePtr` as the kernel's pointer parameter: it must be
// exactly the 8 bytes of the address.
const _: () = assert!(std::mem::size_of::<DevicePtr>() == 8);
const _: () = assert!(std::mem::align_of::<DevicePtr>() == std::mem::align_of::<u64>());

// SAFETY: `DevicePtr` is a struct whose one field is a `u64` and whose size is 8 (asserted
// above), so its bytes are the address's, which is what a kernel's pointer parameter (or a
// `u64` one) reads. Every bit pattern is a valid value.
unsafe impl DeviceRepr for DevicePtr {}

/// How work on a cudarc stream relates to a buffer.
enum User {
    /// One of this crate's streams.
    Known(Stream),
    /// A stream of the buffer's context that this crate does not know.
    Unknown,
}

/// The crate's id of the device of a cudarc stream (for errors).
fn cudarc_device_id(cs: &CudaStream) -> DeviceId {
    DeviceId {
        backend: BackendKind::Cuda,
        ordinal: u32::try_from(cs.context().ordinal()).unwrap_or(u32::MAX),
    }
}

/// A use that cannot go ahead. cudarc's `DevicePtr` cannot return an error, and an error it
/// records is checked only before its *next* call (it binds and checks before asking for the
/// address), so a null address would reach the operation under way (cuBLAS, a copy) and fault
/// the whole context. So: the typed error goes to `device`'s deferred errors (for a caller that
/// catches the panic) and this panics with it.
///
/// # Panics
/// Always.
fn refuse<'a>(
    device: &Device,
    cs: &CudaStream,
    error: Error,
) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
    tracing::error!(%error, "a buffer was used on a cudarc stream it cannot be used on");
    let message = format!(
        "a streamalloc buffer of {} cannot be used on this cudarc stream (of {}): {error}",
        device.id(),
        cudarc_device_id(cs)
    );
    device.defer_error(error);
    panic!("{message}");
}

impl DeviceBuffer {
    /// cudarc's handle to the owner stream (cudarc's `DeviceSlice::stream`).
    ///
    /// # Panics
    /// On a host-backend buffer (cudarc has no stream for it), and should cudarc fail to take
    /// hold of the primary context: the trait cannot return an error.
    pub(crate) fn cudarc_owner(&self) -> &Arc<CudaStream> {
        match self.uses.owner().cudarc_stream_ref() {
            Ok(s) => s,
            Err(e) => panic!(
                "cudarc's DeviceSlice::stream of a buffer on {}: {e}",
                self.device.id()
            ),
        }
    }

    /// Who `cs` is to this buffer, or why it cannot use it.
    fn cudarc_user(&self, cs: &CudaStream) -> Result<User> {
        if self.device.backend() != BackendKind::Cuda {
            return Err(Error::DeviceMismatch {
                expected: self.device.id(),
                actual: cudarc_device_id(cs),
                call: "a buffer used on a cudarc stream",
            });
        }
        let ours = self.device.cudarc_context()?;
        let theirs = cs.context();
        if theirs.cu_ctx() != ours.cu_ctx() {
            if theirs.cu_device() == ours.cu_device() {
                return Err(Error::invalid(format!(
                    "a buffer of {} was used on a cudarc stream of a non-primary context of \
                     that device; streamalloc's memory lives in the primary context",
                    self.device.id()
                )));
            }
            return Err(Error::DeviceMismatch {
                expected: self.device.id(),
                actual: cudarc_device_id(cs),
                call: "a buffer used on a cudarc stream",
            });
        }
        // Registers the owner first, so a cudarc handle the user made over the owner's raw
        // handle is recognised as the owner.
        self.uses.owner().cudarc_stream_ref()?;
        Ok(match Stream::from_cudarc_ref(cs) {
            Some(stream) => User::Known(stream),
            None => User::Unknown,
        })
    }

    /// cudarc's `device_ptr`: the buffer's address at `offset`, with the read on `cs` tracked
    /// (see [`Stream::cudarc_stream`]).
    pub(crate) fn cudarc_read<'a>(
        &'a self,
        offset: usize,
        cs: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        let addr = self.ptr.offset(offset).addr();
        match self.cudarc_user(cs) {
            Ok(User::Known(stream)) => match self.begin_read(&stream) {
                Ok(()) => (addr, SyncOnDrop::Record(None)),
                Err(e) => refuse(&self.device, cs, e),
            },
            Ok(User::Unknown) => {
                // `cs` joins the owner: the owner first takes over a pending hand-off.
                match self.uses.lock().ready() {
                    Ok(_) => self.join_owner(addr, cs),
                    Err(e) => refuse(&self.device, cs, e),
                }
            }
            Err(e) => refuse(&self.device, cs, e),
        }
    }

    /// cudarc's `device_ptr_mut`: the buffer's address at `offset`, with the write on `cs`
    /// tracked (see [`Stream::cudarc_stream`]).
    pub(crate) fn cudarc_write<'a>(
        &'a mut self,
        offset: usize,
        cs: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        let addr = self.ptr.offset(offset).addr();
        match self.cudarc_user(cs) {
            Ok(User::Known(stream)) => match self.take_for(&stream) {
                Ok(()) => (addr, SyncOnDrop::Record(None)),
                Err(e) => refuse(&self.device, cs, e),
            },
            Ok(User::Unknown) => match self.uses.get_mut().order_owner_after_readers() {
                Ok(()) => self.join_owner(addr, cs),
                Err(e) => refuse(&self.device, cs, e),
            },
            Err(e) => refuse(&self.device, cs, e),
        }
    }

    /// `cs`, a stream this crate does not know, waits for the owner's work so far; the
    /// returned `SyncOnDrop` synchronizes it when cudarc's use ends.
    fn join_owner<'a>(
        &self,
        addr: sys::CUdeviceptr,
        cs: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        let owner = match self.uses.owner().cudarc_stream_ref() {
            Ok(owner) => owner,
            Err(e) => return refuse(&self.device, cs, e),
        };
        match cs.join(owner) {
            Ok(()) => (addr, SyncOnDrop::sync_stream(cs)),
            Err(e) => refuse(
                &self.device,
                cs,
                driver_error(&self.device, "cuStreamWaitEvent", e),
            ),
        }
    }

    /// Kernel arguments cannot return an error: a host-backend address given to a CUDA kernel
    /// would fault, so it panics instead.
    pub(crate) fn assert_device_memory(&self) {
        assert!(
            self.device.backend() == BackendKind::Cuda,
            "memory of {} passed as a CUDA kernel argument: host-backend memory is not device \
             memory (use Stream::launch_host_kernel there)",
            self.device.id()
        );
    }

    /// The field a kernel argument pushes: the address, checked to be device memory.
    ///
    /// # Panics
    /// On a host-backend buffer: cudarc's argument builder cannot take an error, and a kernel
    /// given a host-emulation address would fault.
    pub(crate) fn kernel_arg_ptr(&self) -> &DevicePtr {
        self.assert_device_memory();
        // A kernel reads it on the owner (or under a read guard): the owner takes over a
        // pending hand-off first.
        self.ready_for_raw_use();
        &self.ptr
    }

    /// Before a kernel that writes the buffer on its owner: the owner waits for every
    /// recorded and pending reader, as the buffer's own writes do.
    ///
    /// # Panics
    /// On a host-backend buffer, and when the driver fails to record or wait (the context is
    /// then broken): a kernel argument cannot return the error, and writing without the wait
    /// would race with the readers.
    pub(crate) fn order_kernel_write(&mut self) {
        self.assert_device_memory();
        if let Err(e) = self.uses.get_mut().order_owner_after_readers() {
            panic!(
                "ordering a kernel write of a buffer on {} after its readers failed: {e}",
                self.device.id()
            );
        }
    }
}

impl<'r> ByteRange<'r> {
    /// cudarc's `device_ptr` of the range: a read of the whole buffer on `cs`, tracked.
    fn cudarc_read<'a>(self, cs: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>)
    where
        'r: 'a,
    {
        self.buffer().cudarc_read(self.offset(), cs)
    }

    /// The field a kernel argument pushes for the range, launched on the owner: checked to be
    /// device memory, after the owner takes over a pending hand-off.
    fn kernel_arg(&self) -> &DevicePtr {
        self.buffer().assert_device_memory();
        self.buffer().ready_for_raw_use();
        self.addr_ref()
    }
}

impl ByteRangeMut<'_> {
    /// cudarc's `device_ptr_mut` of the range: a write of the whole buffer on `cs`, tracked.
    fn cudarc_write<'a>(&'a mut self, cs: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        let offset = self.as_range().offset();
        self.buffer_mut().cudarc_write(offset, cs)
    }

    /// As [`ByteRange::kernel_arg`].
    fn kernel_arg(&self) -> &DevicePtr {
        self.as_range().kernel_arg();
        self.addr_ref()
    }

    /// The field a kernel argument pushes for a kernel that writes the range on the owner: the
    /// owner first waits for every reader ([`DeviceBuffer::order_kernel_write`]).
    fn kernel_write_arg(&mut self) -> &DevicePtr {
        self.buffer_mut().order_kernel_write();
        self.addr_ref()
    }
}

/// The buffer as cudarc's slice of bytes; [`stream`](DeviceSlice::stream) is its owner's
/// cudarc stream.
///
/// # Panics
/// `stream` panics on a host-backend buffer (cudarc has no stream to return for it).
impl DeviceSlice<u8> for DeviceBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.cudarc_owner()
    }
}

/// Reads through cudarc (cuBLAS inputs, cudarc copies), tracked as [`Stream::cudarc_stream`] says.
impl CudarcDevicePtr<u8> for DeviceBuffer {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        self.cudarc_read(0, stream)
    }
}

/// Writes through cudarc (cuBLAS outputs, cudarc copies): a hand-off to a known stream.
impl DevicePtrMut<u8> for DeviceBuffer {
    fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        self.cudarc_write(0, stream)
    }
}

// SAFETY: pushes a reference to the buffer's address field, which lives as long as the borrow
// `'b` that outlives the builder; the kernel reads its 8 bytes as a pointer parameter.
unsafe impl<'a, 'b: 'a> PushKernelArg<&'b DeviceBuffer> for LaunchArgs<'a> {
    /// The buffer's address, for a kernel launched on its owner stream.
    ///
    /// # Panics
    /// On a host-backend buffer.
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceBuffer) -> &mut Self {
        self.arg(arg.kernel_arg_ptr())
    }
}

// SAFETY: as for `&DeviceBuffer`.
unsafe impl<'a, 'b: 'a> PushKernelArg<&'b mut DeviceBuffer> for LaunchArgs<'a> {
    /// The buffer's address for a kernel that writes it on its owner stream: the owner first
    /// waits for every reader on other streams.
    ///
    /// # Panics
    /// On a host-backend buffer, or when the driver fails to enqueue the wait.
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DeviceBuffer) -> &mut Self {
        arg.order_kernel_write();
        let arg: &'b DeviceBuffer = arg;
        self.arg(arg.kernel_arg_ptr())
    }
}

// SAFETY: pushes a reference to the read buffer's address field, borrowed for `'c`, which
// outlives the guard's borrow `'b` and so the builder.
unsafe impl<'a, 'b: 'a, 'c: 'b> PushKernelArg<&'b ReadGuard<'c>> for LaunchArgs<'a> {
    /// A read on the guard's stream, which must be the launch stream: it waits for the owner
    /// and is a pending reader until the guard is dropped (forget-safe).
    ///
    /// # Panics
    /// On a host-backend buffer.
    #[inline(always)]
    fn arg(&mut self, arg: &'b ReadGuard<'c>) -> &mut Self {
        self.arg(arg.buffer().kernel_arg_ptr())
    }
}

/// The vector as cudarc's slice; [`stream`](DeviceSlice::stream) is its owner's cudarc stream.
///
/// # Panics
/// `stream` panics on a host-backend vector (cudarc has no stream to return for it).
impl<T: Pod> DeviceSlice<T> for DeviceVec<T> {
    fn len(&self) -> usize {
        DeviceVec::len(self)
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.as_buffer().cudarc_owner()
    }
}

/// Reads through cudarc (cuBLAS inputs, cudarc copies), tracked as the buffer's
/// (`DevicePtr for DeviceBuffer`): a known stream becomes a pending reader, an unknown one is
/// synchronized when the returned `SyncOnDrop` drops.
impl<T: Pod> CudarcDevicePtr<T> for DeviceVec<T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        self.as_buffer().cudarc_read(0, stream)
    }
}

/// Writes through cudarc (cuBLAS outputs, cudarc copies): a hand-off to a known stream.
impl<T: Pod> DevicePtrMut<T> for DeviceVec<T> {
    fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        self.buffer_mut().cudarc_write(0, stream)
    }
}

/// A view as cudarc's slice; [`stream`](DeviceSlice::stream) is its vector's owner's.
///
/// # Panics
/// `stream` panics on a view of a host-backend vector.
impl<T: Pod> DeviceSlice<T> for VecView<'_, T> {
    fn len(&self) -> usize {
        VecView::len(self)
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.as_buffer().cudarc_owner()
    }
}

/// Reads of the view's range, tracked as reads of the whole vector.
impl<T: Pod> CudarcDevicePtr<T> for VecView<'_, T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        self.bytes().cudarc_read(stream)
    }
}

/// A mutable view as cudarc's slice; [`stream`](DeviceSlice::stream) is its vector's owner's.
///
/// # Panics
/// `stream` panics on a view of a host-backend vector.
impl<T: Pod> DeviceSlice<T> for VecViewMut<'_, T> {
    fn len(&self) -> usize {
        VecViewMut::len(self)
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.as_view().as_buffer().cudarc_owner()
    }
}

/// Reads of the view's range, tracked as reads of the whole vector.
impl<T: Pod> CudarcDevicePtr<T> for VecViewMut<'_, T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        self.bytes().as_range().cudarc_read(stream)
    }
}

/// Writes of the view's range: a known stream takes the whole vector over (a hand-off).
impl<T: Pod> DevicePtrMut<T> for VecViewMut<'_, T> {
    fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        self.bytes_mut().cudarc_write(stream)
    }
}

// SAFETY: pushes a reference to the vector's address field, borrowed for `'b`, which outlives
// the builder; the kernel reads its 8 bytes as a pointer parameter.
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b DeviceVec<T>> for LaunchArgs<'a> {
    /// The vector's address, for a kernel launched on its owner stream (see
    /// [`Stream::cudarc_stream`] for other streams).
    ///
    /// # Panics
    /// On a host-backend vector.
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceVec<T>) -> &mut Self {
        self.arg(arg.as_buffer().kernel_arg_ptr())
    }
}

// SAFETY: as for `&DeviceVec<T>`; the owner waits for the readers first (as for
// `&mut DeviceBuffer`).
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b mut DeviceVec<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DeviceVec<T>) -> &mut Self {
        arg.buffer_mut().order_kernel_write();
        let arg: &'b DeviceVec<T> = arg;
        self.arg(arg.as_buffer().kernel_arg_ptr())
    }
}

// SAFETY: pushes a reference to the view's address field, borrowed for `'b`, which outlives
// the builder.
unsafe impl<'a, 'b: 'a, 'c: 'b, T: Pod> PushKernelArg<&'b VecView<'c, T>> for LaunchArgs<'a> {
    /// The address of the view's first element, for a kernel launched on the vector's owner.
    ///
    /// # Panics
    /// On a view of a host-backend vector.
    #[inline(always)]
    fn arg(&mut self, arg: &'b VecView<'c, T>) -> &mut Self {
        self.arg(arg.bytes().kernel_arg())
    }
}

// SAFETY: as for `&VecView`; the owner waits for the readers first (as for
// `&mut DeviceBuffer`).
unsafe impl<'a, 'b: 'a, 'c: 'b, T: Pod> PushKernelArg<&'b mut VecViewMut<'c, T>>
    for LaunchArgs<'a>
{
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut VecViewMut<'c, T>) -> &mut Self {
        self.arg(arg.bytes_mut().kernel_write_arg())
    }
}

// SAFETY: as for `&VecView`.
unsafe impl<'a, 'b: 'a, 'c: 'b, T: Pod> PushKernelArg<&'b VecViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b VecViewMut<'c, T>) -> &mut Self {
        self.arg(arg.bytes().kernel_arg())
    }
}

/// The scalar as cudarc's one-element slice; [`stream`](DeviceSlice::stream) is its owner's.
///
/// # Panics
/// `stream` panics on a host-backend scalar.
impl<T: Pod + Send> DeviceSlice<T> for DeviceScalar<T> {
    fn len(&self) -> usize {
        1
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.as_buffer().cudarc_owner()
    }
}

/// Reads through cudarc (a cuBLAS scalar in device pointer mode, say), tracked as
/// [`Stream::cudarc_stream`] says.
impl<T: Pod + Send> CudarcDevicePtr<T> for DeviceScalar<T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        self.as_buffer().cudarc_read(0, stream)
    }
}

/// Writes through cudarc (a cuBLAS result such as a dot product): a hand-off to a known stream.
impl<T: Pod + Send> DevicePtrMut<T> for DeviceScalar<T> {
    fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        self.buffer_mut().cudarc_write(0, stream)
    }
}

// SAFETY: pushes a reference to the scalar's address field, borrowed for `'b`, which outlives
// the builder: the kernel gets a `T*` to the value in device memory.
unsafe impl<'a, 'b: 'a, T: Pod + Send> PushKernelArg<&'b DeviceScalar<T>> for LaunchArgs<'a> {
    /// The address of the value (a `const T*` parameter), for a kernel launched on the
    /// scalar's owner stream; on another stream pass `scalar.read_on(&stream)?` instead.
    ///
    /// # Panics
    /// On a host-backend scalar.
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceScalar<T>) -> &mut Self {
        self.arg(arg.as_buffer().kernel_arg_ptr())
    }
}

// SAFETY: as for `&DeviceScalar<T>`; the owner waits for the readers first (as for
// `&mut DeviceBuffer`).
unsafe impl<'a, 'b: 'a, T: Pod + Send> PushKernelArg<&'b mut DeviceScalar<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DeviceScalar<T>) -> &mut Self {
        arg.buffer_mut().order_kernel_write();
        let arg: &'b DeviceScalar<T> = arg;
        self.arg(arg.as_buffer().kernel_arg_ptr())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{CudaResource, Device, DeviceBuffer, DeviceVec, HostConfig, Stream};

    /// A host-backend buffer has no cudarc stream: `DeviceSlice::stream` cannot return an
    /// error, so it panics with a message that names the device.
    #[test]
    fn a_host_buffer_has_no_cudarc_owner() {
        let device = Device::host_with(HostConfig::default());
        let stream = Stream::new(&device).unwrap();
        let buf = DeviceBuffer::try_new(64, &stream, CudaResource::new(&device).unwrap()).unwrap();
        let id = device.id().to_string();
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = buf.cudarc_owner();
        }))
        .unwrap_err();
        let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains(&id) && msg.contains("host-backend"), "{msg}");
    }

    /// A forgotten `KernelRead` of a view still orders the free after the reads enqueued on its
    /// stream meanwhile (a 200 ms "kernel" on the reader stands in for the launch): the owner
    /// reaches the free only after the reader has passed the read.
    #[test]
    fn a_forgotten_kernel_read_still_orders_the_free() {
        let device = Device::host_with(HostConfig::default());
        let (owner, reader) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
        let v =
            DeviceVec::<u32>::try_new(1024, &owner, CudaResource::new(&device).unwrap()).unwrap();
        let read = v.slice(10..20).unwrap().on(&reader).unwrap();
        assert_eq!((read.len(), read.ptr()), (10, v.ptr().offset(40)));
        reader.enqueue_delay(Duration::from_millis(200)).unwrap();
        let read_done = reader.record().unwrap();
        std::mem::forget(read);
        drop(v);
        owner.synchronize_blocking().unwrap(); // past the free
        assert!(
            read_done.is_complete().unwrap(),
            "the free did not wait for the read"
        );
        assert!(device.take_deferred_error().is_none());
    }

    /// `on` checks the device: a typed error with both ids, nothing registered.
    #[test]
    fn a_kernel_read_on_another_device_is_refused() {
        let device = Device::host_with(HostConfig::default());
        let other = Device::host_with(HostConfig::default());
        let v = DeviceVec::<u8>::try_new(
            8,
            &Stream::new(&device).unwrap(),
            CudaResource::new(&device).unwrap(),
        )
        .unwrap();
        let refused = v.on(&Stream::new(&other).unwrap()).map(drop);
        match refused {
            Err(crate::Error::DeviceMismatch {
                expected, actual, ..
            }) => {
                assert_eq!((expected, actual), (device.id(), other.id()));
            }
            other => panic!("expected DeviceMismatch, got {other:?}"),
        }
    }
}
