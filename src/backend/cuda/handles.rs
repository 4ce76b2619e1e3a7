//! `Send + Sync` newtypes over the driver's raw handles (`CUcontext`, `CUstream`, `CUevent`,
//! `CUmemoryPool`, `CUmodule`, `CUfunction`): the driver API is thread-safe, so a handle may
//! travel between threads; its owner decides its lifetime.

use std::fmt;

use cudarc::driver::sys;

/// Declares a `Send + Sync` newtype over a raw driver handle.
macro_rules! driver_handle {
    ($(#[$meta:meta])* $name:ident($raw:ty)) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq)]
        pub(crate) struct $name(pub(crate) $raw);

        // SAFETY: the handle is an opaque token that the driver resolves; the CUDA driver API is
        // thread-safe, so a handle may be passed to it from any thread. Lifetimes are managed by
        // the owner of the handle, not by this token. What a token names may depend on the
        // calling thread (`CU_STREAM_PER_THREAD`): the owner refuses other threads there.
        unsafe impl Send for $name {}
        // SAFETY: as for `Send`: sharing the token across threads only lets several threads pass
        // it to the thread-safe driver API.
        unsafe impl Sync for $name {}

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:p})"), self.0)
            }
        }
    };
}

driver_handle!(
    /// A `CUcontext`.
    RawContext(sys::CUcontext)
);
driver_handle!(
    /// A `CUstream`. One value is not a stream of its own: `CU_STREAM_PER_THREAD` names the
    /// per-thread default stream *of the calling thread*, so passing it to another thread makes
    /// it another stream. The token may still travel (it is only an integer to the driver);
    /// [`CudaStream`](super::CudaStream) keeps its thread, and every use of it through
    /// [`AnyStream`](crate::backend::AnyStream) is refused on any other.
    RawStream(sys::CUstream)
);
driver_handle!(
    /// A `CUevent`.
    RawEvent(sys::CUevent)
);
driver_handle!(
    /// A `CUmemoryPool`.
    RawMemPool(sys::CUmemoryPool)
);
driver_handle!(
    /// A `CUmodule`.
    RawModule(sys::CUmodule)
);
driver_handle!(
    /// A `CUfunction`.
    RawFunction(sys::CUfunction)
);
