use std::sync::atomic::{AtomicUsize, Ordering};

use super::handle::Stream;
use crate::device::Device;
use crate::error::{Error, Result};

/// A fixed set of streams handed out round-robin (RMM's `cuda_stream_pool`).
///
/// # Examples
///
/// ```
/// use streamalloc::{Device, StreamPool};
///
/// let pool = StreamPool::new(&Device::host(), 2)?;
/// let (a, b, c) = (pool.get(), pool.get(), pool.get());
/// assert_ne!(a, b);
/// assert_eq!(a, c);
/// # Ok::<(), streamalloc::Error>(())
/// ```
#[derive(Debug)]
pub struct StreamPool {
    streams: Vec<Stream>,
    next: AtomicUsize,
}

impl StreamPool {
    /// Creates `size` streams on `device`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `size` is 0; a driver error when a stream cannot be
    /// created.
    pub fn new(device: &Device, size: usize) -> Result<StreamPool> {
        if size == 0 {
            return Err(Error::invalid("a stream pool needs at least one stream"));
        }
        let streams = (0..size)
            .map(|_| Stream::new(device))
            .collect::<Result<_>>()?;
        Ok(StreamPool {
            streams,
            next: AtomicUsize::new(0),
        })
    }

    /// The next stream, round-robin.
    pub fn get(&self) -> Stream {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.streams.len();
        self.streams[i].clone()
    }

    /// The stream at `index`, modulo the pool size.
    pub fn get_at(&self, index: usize) -> Stream {
        self.streams[index % self.streams.len()].clone()
    }

    /// How many streams the pool holds.
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    /// Always false: a pool holds at least one stream.
    pub fn is_empty(&self) -> bool {
        false
    }
}
