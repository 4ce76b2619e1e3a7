//! cudarc interop for streams: cudarc's [`CudaStream`] for a [`Stream`], a cudarc stream adopted
//! as a [`Stream`], and the registry that maps a cudarc stream back to its [`Stream`] (so the
//! buffers' `DevicePtr` impls can track a use on it).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};

use cudarc::driver::CudaStream;
use parking_lot::Mutex;

use super::handle::{Stream, StreamInner};
use crate::backend::{AnyBackend, AnyStream};
use crate::device::Device;
use crate::error::{Error, Result};

/// `(CUcontext, CUstream)` as integers: the built-in streams have the same handle in every
/// context, so the context is part of the key.
type RawKey = (usize, usize);

fn key(stream: &CudaStream) -> RawKey {
    (
        stream.context().cu_ctx() as usize,
        stream.cu_stream() as usize,
    )
}

/// Every stream handed to or adopted from cudarc, by raw handle. Weak: the registry keeps no
/// stream alive; dead entries are dropped as new ones come.
fn registry() -> &'static Mutex<HashMap<RawKey, Weak<StreamInner>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<RawKey, Weak<StreamInner>>>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

fn register(cudarc: &CudaStream, stream: &Stream) {
    let mut map = registry().lock();
    map.retain(|_, weak| weak.strong_count() > 0);
    map.insert(key(cudarc), Arc::downgrade(&stream.inner));
}

impl Stream {
    /// cudarc's handle to this stream (`CudaContext::wrap_borrowed_stream` over it), so that
    /// cudarc kernels, cuBLAS and copies can be enqueued on it. Every call returns the same
    /// handle.
    ///
    /// The handle may outlive every [`Stream`] handle: the `CUstream` is then destroyed only
    /// once the last cudarc handle is gone.
    ///
    /// # Buffers in cudarc calls
    /// [`DeviceBuffer`](crate::DeviceBuffer), [`DeviceVec`](crate::DeviceVec) and its views
    /// implement cudarc's `DeviceSlice`, `DevicePtr` and `DevicePtrMut` (so cuBLAS and cudarc's
    /// copies take them) and are kernel arguments (`launch_builder(&f).arg(&v)`). Each use is
    /// ordered like the crate's own operations:
    /// - Through `DevicePtr` / `DevicePtrMut` (cuBLAS, copies), on a stream of this crate (this
    ///   handle, or one adopted by [`from_cudarc`](Stream::from_cudarc)): a read makes the
    ///   stream wait for the owner's work so far and registers it as a reader, so the owner's
    ///   next write, hand-off or free waits for it, even if everything returned is forgotten; a
    ///   write hands the buffer over to that stream (as
    ///   [`set_stream`](crate::DeviceBuffer::set_stream)): it waits for the old owner and every
    ///   reader, then owns and frees the buffer.
    /// - On a cudarc stream this crate does not know (of the same device): it waits for the
    ///   owner (and for a write the owner first waits for the readers), and the returned
    ///   `SyncOnDrop` synchronizes that stream when dropped. Forgetting that `SyncOnDrop` is the
    ///   one way to let later work (the free included) overtake the use: adopt the stream with
    ///   [`from_cudarc`](Stream::from_cudarc) instead.
    /// - On a stream of another device or context, or with a host-backend buffer: a panic (the
    ///   trait cannot return an error, and a null address would fault the operation under way),
    ///   after [`Error::DeviceMismatch`] (both devices) or [`Error::InvalidArgument`] (another
    ///   context) went to the buffer's device's
    ///   [`take_deferred_error`](crate::Device::take_deferred_error). Check first with
    ///   [`Stream::from_cudarc`], which returns those errors.
    /// - cudarc's copies between two devices (`memcpy_dtod` / `clone_dtod` from a buffer of one
    ///   device on a stream of another) run on a stream the buffer never sees: they are not
    ///   tracked, and freeing the source may overtake them. Use
    ///   [`copy_from_peer`](crate::DeviceBuffer::copy_from_peer) /
    ///   [`try_clone_to`](crate::DeviceBuffer::try_clone_to), which order both devices.
    /// - Kernel arguments cannot see the launch stream (cudarc keeps it private): launch with
    ///   `&v` / `&mut v` on the owner's handle (`v.stream().cudarc_stream()?`); a `&mut v`
    ///   argument first makes the owner wait for every reader. On another stream, pass
    ///   `v.on(&stream)?` (a [`KernelRead`](crate::KernelRead); vectors, views and scalars) or
    ///   a [`ReadGuard`](crate::ReadGuard) from `read_on` for reads (registered as a reader
    ///   when made: forget-safe), or hand the vector over with `set_stream` first for writes. A host-backend buffer as a kernel argument panics (a CUDA kernel cannot read
    ///   it and the builder cannot return an error).
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a host-backend device (it has no CUDA stream); driver errors
    /// when cudarc cannot take hold of the device's primary context; [`Error::WrongThread`] for
    /// a [per-thread default stream](Stream::per_thread_default) of another thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{Device, Error, Stream};
    ///
    /// let stream = Stream::new(&Device::host())?;
    /// assert!(matches!(stream.cudarc_stream(), Err(Error::Unsupported { .. })));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn cudarc_stream(&self) -> Result<Arc<CudaStream>> {
        self.cudarc_stream_ref().cloned()
    }

    /// [`cudarc_stream`](Stream::cudarc_stream), borrowed from the stream (cudarc's
    /// `DeviceSlice::stream` hands out a reference).
    pub(crate) fn cudarc_stream_ref(&self) -> Result<&Arc<CudaStream>> {
        match self.raw() {
            AnyStream::Cuda(raw) => {
                // cudarc's handle would carry the per-thread stream's handle to other threads.
                self.raw().usable_here()?;
                let first = !raw.has_cudarc_stream();
                let cudarc = raw.cudarc_stream()?;
                if first {
                    register(cudarc, self);
                }
                Ok(cudarc)
            }
            AnyStream::Host(_) => Err(Error::unsupported(
                "cudarc streams (a host-backend stream has no CUDA stream)",
                self.device().id(),
            )),
        }
    }

    /// Adopts a stream made by cudarc: the returned [`Stream`] enqueues on it, with the same
    /// events, completion machinery and buffer tracking as [`Stream::new`]'s, and keeps the
    /// cudarc handle (and so the stream) alive while it lives. A stream that came from
    /// [`cudarc_stream`](Stream::cudarc_stream) gives back the very [`Stream`] it came from
    /// while that lives.
    ///
    /// Adopting the streams you launch on is what makes buffer tracking exact: a buffer of
    /// this crate used on a stream it does not know is ordered conservatively (see the
    /// buffers' `DevicePtr` impls).
    ///
    /// # Errors
    /// [`Error::DriverUnavailable`] / [`Error::NoSuchDevice`] as [`Device::cuda`];
    /// [`Error::InvalidArgument`] when the stream belongs to a context other than its device's
    /// primary context (the only one this crate uses).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use streamalloc::{Device, Stream};
    ///
    /// let ctx = Device::cuda(0)?.cudarc_context()?;
    /// let theirs = ctx.new_stream().expect("cudarc stream");
    /// let ours = Stream::from_cudarc(theirs.clone())?;
    /// assert_eq!(ours.raw_handle(), theirs.cu_stream() as u64);
    /// # Ok::<(), streamalloc::Error>(())
    /// ```
    pub fn from_cudarc(stream: Arc<CudaStream>) -> Result<Stream> {
        if let Some(known) = Stream::from_cudarc_ref(&stream) {
            return Ok(known);
        }
        let device = Device::cuda(stream.context().ordinal())?;
        let raw = match device.raw() {
            AnyBackend::Cuda(backend) => backend.adopt_stream(stream.clone())?,
            AnyBackend::Host(_) => unreachable!("Device::cuda returned a host device"),
        };
        let adopted = Stream::wrap(&device, AnyStream::Cuda(raw));
        register(&stream, &adopted);
        Ok(adopted)
    }

    /// The live [`Stream`] that `stream` was handed out by or adopted into, if any.
    pub(crate) fn from_cudarc_ref(stream: &CudaStream) -> Option<Stream> {
        let inner = registry().lock().get(&key(stream))?.upgrade()?;
        Some(Stream { inner })
    }
}

#[cfg(feature = "cublas")]
impl Stream {
    /// A cuBLAS handle that enqueues on this stream (cudarc's `CudaBlas`, libcublas loaded at
    /// run time). Its calls take this crate's buffers and vectors through cudarc's `DevicePtr`
    /// / `DevicePtrMut`, tracked on this stream: inputs are reads on it, outputs are handed to
    /// it.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a host-backend stream, and when libcublas cannot be loaded (the
    /// message names it; nothing panics); [`Error::Driver`] (`cublasCreate`) when the handle
    /// cannot be made.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamalloc::{Device, Error, Stream};
    ///
    /// let stream = Stream::new(&Device::host())?;
    /// assert!(matches!(stream.cublas(), Err(Error::Unsupported { .. })));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn cublas(&self) -> Result<cudarc::cublas::CudaBlas> {
        let stream = self.cudarc_stream()?;
        crate::backend::cuda::interop::cublas_available()
            .map_err(|why| Error::unsupported(why, self.device().id()))?;
        cudarc::cublas::CudaBlas::new(stream).map_err(|e| Error::Driver {
            call: "cublasCreate",
            code: e.0 as i32,
            name: format!("{:?}", e.0),
            device: self.device().id(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_streams_have_no_cudarc_stream() {
        let device = Device::host();
        let stream = Stream::new(&device).unwrap();
        match stream.cudarc_stream() {
            Err(Error::Unsupported { device: d, what }) => {
                assert_eq!(d, device.id());
                assert!(what.contains("host-backend"), "{what}");
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
}
