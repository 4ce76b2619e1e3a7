use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::Result;
use crate::resource::{DevicePtr, MemoryResource};
use crate::stream::Stream;

/// The future of [`MemoryResource::allocate`].
///
/// Its first poll is the synchronous fast path, [`MemoryResource::try_allocate`]: when memory
/// is there it resolves at once, with no allocation or lock of its own.
///
/// # Cancel safety
/// Dropping it before it resolves leaves nothing allocated and nothing reserved.
#[must_use = "futures do nothing unless awaited"]
pub struct Allocate<'a, R: ?Sized> {
    mr: &'a R,
    bytes: usize,
    stream: &'a Stream,
}

impl<'a, R: MemoryResource + ?Sized> Allocate<'a, R> {
    pub(crate) fn new(mr: &'a R, bytes: usize, stream: &'a Stream) -> Self {
        Allocate { mr, bytes, stream }
    }

    /// The number of bytes requested.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl<R: MemoryResource + ?Sized> Future for Allocate<'_, R> {
    type Output = Result<DevicePtr>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<DevicePtr>> {
        Poll::Ready(self.mr.try_allocate(self.bytes, self.stream))
    }
}

impl<R: ?Sized> fmt::Debug for Allocate<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocate")
            .field("bytes", &self.bytes)
            .field("stream", &self.stream.id())
            .finish()
    }
}
