//! The one core under every container and view: a borrowed byte range of a buffer (cudarc's
//! `DeviceSlice`), which holds the address, the accessors and the ordered copies once.
//!
//! [`DeviceBuffer`], [`BufferView`](super::BufferView), [`DeviceVec`](super::DeviceVec) and its
//! views are thin: they turn their own units (bytes, elements, ranges) into a [`ByteRange`] or
//! [`ByteRangeMut`] and forward. A copy that reads the range goes through
//! [`ByteRange::read_on_owner`], one that writes it through [`ByteRangeMut::write_on_owner`]:
//! the two places that order host copies after the buffer's other uses.

use std::mem::size_of;
use std::ops::{Bound, Range, RangeBounds};

use bytemuck::Pod;

use super::device_buffer::DeviceBuffer;
use super::host_copy::{
    CopyFromHost, CopyFromSlice, CopyToHost, CopyToSlice, EnqueuedCopy, HostBuffer, Unit,
};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::resource::DevicePtr;
use crate::stream::Stream;

/// `range` resolved against a length of `len` units (`what` names them in errors): the
/// start and end, checked to be in order and in bounds.
pub(crate) fn checked_range(
    range: impl RangeBounds<usize>,
    len: usize,
    what: &str,
) -> Result<Range<usize>> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    let (Some(start), Some(end)) = (start, end) else {
        return Err(Error::invalid(format!(
            "slice: a range bound past usize::MAX does not fit {len} {what}"
        )));
    };
    if start > end {
        return Err(Error::invalid(format!(
            "slice: the range {start}..{end} is reversed (start > end)"
        )));
    }
    if end > len {
        return Err(Error::invalid(format!(
            "slice: the range {start}..{end} is out of bounds of {len} {what}"
        )));
    }
    Ok(start..end)
}

/// The number of whole `E` in `bytes` (0 for a zero-sized `E`, of which no container holds
/// any).
#[inline]
pub(crate) fn elements<E>(bytes: usize) -> usize {
    bytes.checked_div(size_of::<E>()).unwrap_or(0)
}

/// A shared borrow of the bytes `offset..offset + len` of a buffer.
#[derive(Clone, Copy)]
pub(crate) struct ByteRange<'a> {
    buf: &'a DeviceBuffer,
    /// The address of the first byte, `buf.ptr + offset`, kept so a kernel argument can borrow
    /// it.
    addr: DevicePtr,
    /// `offset + len <= buf.len()`.
    offset: usize,
    len: usize,
}

impl<'a> ByteRange<'a> {
    /// The bytes `offset..offset + len` of `buf`, checked by the caller to be in bounds.
    #[inline]
    pub(crate) fn new(buf: &'a DeviceBuffer, offset: usize, len: usize) -> Self {
        debug_assert!(offset + len <= buf.len());
        ByteRange {
            addr: buf.ptr.offset(offset),
            buf,
            offset,
            len,
        }
    }

    /// All of `buf`'s bytes in use.
    #[inline]
    pub(crate) fn whole(buf: &'a DeviceBuffer) -> Self {
        Self::new(buf, 0, buf.len)
    }

    /// The bytes `range` of this range, checked by the caller to be in bounds.
    #[inline]
    pub(crate) fn range(&self, range: Range<usize>) -> Self {
        Self::new(self.buf, self.offset + range.start, range.len())
    }

    pub(crate) fn buffer(&self) -> &'a DeviceBuffer {
        self.buf
    }

    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The address of the first byte, for identity (`Debug`, checks): no hand-off is taken
    /// over. Work enqueued through it uses [`ptr`](ByteRange::ptr).
    pub(crate) fn addr(&self) -> DevicePtr {
        self.addr
    }

    /// The address of the first byte, borrowed (a kernel argument pushes a reference).
    #[cfg_attr(not(feature = "cuda-driver"), allow(dead_code))]
    pub(crate) fn addr_ref(&self) -> &DevicePtr {
        &self.addr
    }

    /// The address of the first byte, handed out for work the crate does not enqueue: the
    /// owner first takes over a pending hand-off ([`DeviceBuffer::ready_for_raw_use`]).
    pub(crate) fn ptr(&self) -> DevicePtr {
        self.buf.ready_for_raw_use();
        self.addr
    }

    /// The buffer's owner, as [`DeviceBuffer::stream`].
    pub(crate) fn stream(&self) -> Stream {
        self.buf.stream()
    }

    pub(crate) fn device(&self) -> &'a Device {
        &self.buf.device
    }

    /// Enqueues a copy that reads the range on the owner: the owner first takes over a pending
    /// hand-off, and the copy's completion event becomes the buffer's last use.
    fn read_on_owner<C: EnqueuedCopy>(&self, enqueue: impl FnOnce(&Stream) -> C) -> C {
        let mut uses = self.buf.uses.lock();
        let owner = match uses.ready() {
            Ok(owner) => owner,
            Err(e) => return C::failed(e),
        };
        let copy = enqueue(owner);
        uses.used_until(copy.done_event());
        copy
    }

    /// Copies the range into the start of `host` on the owner, counted in `unit`.
    pub(crate) fn copy_to_host<B: HostBuffer>(&self, unit: Unit, host: B) -> CopyToHost<B> {
        let (addr, len) = (self.addr, elements::<B::Elem>(self.len));
        self.read_on_owner(|owner| {
            // SAFETY: `len` elements at `addr` lie in the range, inside the buffer, whose
            // memory is freed, and written by other streams, only after a point of the owner
            // that follows this copy (the free is on the owner or on a later owner that waits
            // for this one); the owner's own later writes are stream-ordered after it, its
            // earlier owners' before it (`ready`). The owner changes only through `&mut`, so
            // not while the range borrows the buffer.
            unsafe { CopyToHost::start(unit, owner, addr, len, host) }
        })
    }

    /// Copies the range into the start of the borrowed `host`, staged, counted in `unit`.
    pub(crate) fn copy_to_host_slice<'h, T: Pod>(
        &self,
        unit: Unit,
        host: &'h mut [T],
    ) -> CopyToSlice<'h> {
        let (addr, len) = (self.addr, elements::<T>(self.len));
        self.read_on_owner(|owner| {
            // SAFETY: as in `copy_to_host`.
            unsafe { CopyToSlice::start(unit, owner, addr, len, host) }
        })
    }
}

/// An exclusive borrow of the bytes `offset..offset + len` of a buffer: what writes it.
pub(crate) struct ByteRangeMut<'a> {
    buf: &'a mut DeviceBuffer,
    /// As [`ByteRange`]'s.
    addr: DevicePtr,
    offset: usize,
    len: usize,
}

impl<'a> ByteRangeMut<'a> {
    /// The bytes `offset..offset + len` of `buf`, checked by the caller to be in bounds.
    #[inline]
    pub(crate) fn new(buf: &'a mut DeviceBuffer, offset: usize, len: usize) -> Self {
        debug_assert!(offset + len <= buf.len());
        ByteRangeMut {
            addr: buf.ptr.offset(offset),
            buf,
            offset,
            len,
        }
    }

    /// All of `buf`'s bytes in use.
    #[inline]
    pub(crate) fn whole(buf: &'a mut DeviceBuffer) -> Self {
        let len = buf.len;
        Self::new(buf, 0, len)
    }

    /// The bytes `range` of this range (a reborrow), checked by the caller to be in bounds.
    #[inline]
    pub(crate) fn range_mut(&mut self, range: Range<usize>) -> ByteRangeMut<'_> {
        ByteRangeMut::new(self.buf, self.offset + range.start, range.len())
    }

    /// The same bytes, reborrowed.
    #[inline]
    pub(crate) fn reborrow(&mut self) -> ByteRangeMut<'_> {
        ByteRangeMut {
            buf: self.buf,
            addr: self.addr,
            offset: self.offset,
            len: self.len,
        }
    }

    /// The buffer, the offset and the length, for a kernel argument that keeps the borrow.
    pub(crate) fn into_parts(self) -> (&'a mut DeviceBuffer, usize, usize) {
        (self.buf, self.offset, self.len)
    }

    /// The same bytes, shared.
    #[inline]
    pub(crate) fn as_range(&self) -> ByteRange<'_> {
        ByteRange {
            buf: self.buf,
            addr: self.addr,
            offset: self.offset,
            len: self.len,
        }
    }

    /// The whole buffer, for crate code that hands it off before a write (cudarc kernel
    /// launches).
    #[cfg(feature = "cuda-driver")]
    pub(crate) fn buffer_mut(&mut self) -> &mut DeviceBuffer {
        self.buf
    }

    /// As [`ByteRange::addr_ref`].
    #[cfg_attr(not(feature = "cuda-driver"), allow(dead_code))]
    pub(crate) fn addr_ref(&self) -> &DevicePtr {
        &self.addr
    }

    /// Enqueues a copy that writes the range on the owner: the owner first waits for its
    /// pending hand-off and every read, and the copy's completion event becomes the buffer's
    /// last use.
    fn write_on_owner<C: EnqueuedCopy>(&mut self, enqueue: impl FnOnce(&Stream) -> C) -> C {
        let mut uses = self.buf.uses.get_mut();
        if let Err(e) = uses.order_owner_after_readers() {
            return C::failed(e);
        }
        let copy = enqueue(uses.owner());
        uses.used_until(copy.done_event());
        copy
    }

    /// Copies all of `host` into the start of the range on the owner, counted in `unit`.
    pub(crate) fn copy_from_host<B: HostBuffer>(&mut self, unit: Unit, host: B) -> CopyFromHost<B> {
        let (addr, len) = (self.addr, elements::<B::Elem>(self.len));
        self.write_on_owner(|owner| {
            // SAFETY: room for `len` elements at `addr` lies in the range, inside the buffer,
            // whose memory is freed, read or written by other streams only after a point of the
            // owner that follows this copy (the free is on the owner or a later owner that waits
            // for this one; other streams read it only after a `read_on` that waits for the
            // owner); every recorded read is ordered before it (`write_on_owner`).
            unsafe { CopyFromHost::start(unit, owner, addr, len, host) }
        })
    }

    /// Copies all of the borrowed `host` into the start of the range, staged, counted in
    /// `unit`.
    pub(crate) fn copy_from_host_slice<T: Pod>(&mut self, unit: Unit, host: &[T]) -> CopyFromSlice {
        let (addr, len) = (self.addr, elements::<T>(self.len));
        self.write_on_owner(|owner| {
            // SAFETY: as in `copy_from_host`.
            unsafe { CopyFromSlice::start(unit, owner, addr, len, host) }
        })
    }
}
