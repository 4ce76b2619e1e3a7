//! Completion flags: words of host memory that device work sets when a stream passes a point,
//! for the completion driver's flag strategy (`cuStreamWriteValue32` into pinned mapped memory
//! on CUDA, a queued store on the host backend). Reading one is a load, not a driver call.
//!
//! A flag is taken from its device's [`FlagSlab`] with a fresh token, the stream is told to
//! write the token into it, and the reader compares. A slot goes back to the slab only after
//! its token was seen, so a late write can never land on a slot someone else now waits on;
//! a flag dropped before its write was seen leaks its slot, and keeps the slab's memory for
//! ever (the device may still write there).

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// How many flags a device has: completions armed beyond it fall back to event queries.
pub(crate) const FLAG_SLOTS: u32 = 4096;

/// The flag words of one device.
pub(crate) struct FlagSlab {
    /// `len` words, valid until the slab's `release` runs (at drop); written by the device.
    words: NonNull<AtomicU32>,
    len: u32,
    /// Slots nobody waits on, and no write is pending for.
    free: Mutex<Vec<u32>>,
    /// The token the next flag gets (never 0: a fresh slot reads 0).
    next_token: AtomicU32,
    /// Gives the memory back; `None` once run.
    release: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

// SAFETY: the words are atomics in memory that the slab owns until it drops; every access goes
// through `&AtomicU32`, and `release` is only called once, at drop.
unsafe impl Send for FlagSlab {}
// SAFETY: as above: shared access is by atomic loads and stores only.
unsafe impl Sync for FlagSlab {}

impl FlagSlab {
    /// A slab over `len` words at `words`, zeroed by the caller; `release` frees them.
    ///
    /// # Safety
    /// `words` points at `len` zeroed, 4-byte aligned words of memory that stay valid (and that
    /// nothing else uses) until `release` is called.
    pub(crate) unsafe fn new(
        words: NonNull<AtomicU32>,
        len: u32,
        release: Box<dyn FnOnce() + Send>,
    ) -> Arc<Self> {
        Arc::new(FlagSlab {
            words,
            len,
            free: Mutex::new((0..len).rev().collect()),
            next_token: AtomicU32::new(1),
            release: Mutex::new(Some(release)),
        })
    }

    /// A slab in ordinary host memory (the host backend's).
    pub(crate) fn on_heap(len: u32) -> Arc<Self> {
        let words: Box<[AtomicU32]> = (0..len).map(|_| AtomicU32::new(0)).collect();
        let raw = Box::into_raw(words);
        let start = NonNull::new(raw.cast::<AtomicU32>()).expect("a box is never null");
        let addr = raw as *mut AtomicU32 as usize;
        let release = Box::new(move || {
            let raw = std::ptr::slice_from_raw_parts_mut(addr as *mut AtomicU32, len as usize);
            // SAFETY: `raw` came from `Box::into_raw` above and is rebuilt once, here.
            drop(unsafe { Box::from_raw(raw) });
        });
        // SAFETY: `len` zeroed atomics, valid until `release` rebuilds and drops the box.
        unsafe { Self::new(start, len, release) }
    }

    /// The word of `slot`.
    ///
    /// # Panics
    /// When `slot` is not below the slab's length.
    pub(crate) fn word(&self, slot: u32) -> &AtomicU32 {
        assert!(slot < self.len, "flag slot {slot} of {}", self.len);
        // SAFETY: `slot < len`, and the words are valid while `self` is (see `new`).
        unsafe { &*self.words.as_ptr().add(slot as usize) }
    }

    /// A flag for one completion, or `None` when every slot is in use.
    pub(crate) fn take(self: &Arc<Self>) -> Option<DeviceFlag> {
        let slot = self.free.lock().pop()?;
        let mut token = self.next_token.fetch_add(1, Ordering::Relaxed);
        if token == 0 {
            token = self.next_token.fetch_add(1, Ordering::Relaxed);
        }
        // No write is pending for the slot (it went back only after its token was seen).
        self.word(slot).store(0, Ordering::Relaxed);
        Some(DeviceFlag {
            slab: self.clone(),
            slot,
            token,
            seen: false,
        })
    }
}

impl Drop for FlagSlab {
    fn drop(&mut self) {
        if let Some(release) = self.release.get_mut().take() {
            release();
        }
    }
}

impl fmt::Debug for FlagSlab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlagSlab")
            .field("len", &self.len)
            .field("free", &self.free.lock().len())
            .finish()
    }
}

/// One slot of a [`FlagSlab`], waiting for its token.
pub(crate) struct DeviceFlag {
    slab: Arc<FlagSlab>,
    slot: u32,
    token: u32,
    /// The token was seen: no write is pending, the slot may be reused.
    seen: bool,
}

impl DeviceFlag {
    /// The address device work writes the token to.
    #[cfg_attr(not(feature = "cuda-driver"), allow(dead_code))] // the CUDA backend's write
    pub(crate) fn addr(&self) -> u64 {
        self.slab.word(self.slot) as *const AtomicU32 as u64
    }

    /// The value that marks the flag set.
    pub(crate) fn token(&self) -> u32 {
        self.token
    }

    /// The word itself (tests store tokens by hand).
    #[cfg(test)]
    pub(crate) fn word(&self) -> &AtomicU32 {
        self.slab.word(self.slot)
    }

    /// What a backend's queued store needs: the slab (kept alive by the store) and the slot.
    pub(crate) fn target(&self) -> (Arc<FlagSlab>, u32) {
        (self.slab.clone(), self.slot)
    }

    /// Gives the slot back at once: no write of the token was enqueued (enqueueing it failed).
    pub(crate) fn unwritten(mut self) {
        self.seen = true;
    }

    /// Whether the token has been written: the stream passed the point. A load, no driver
    /// call.
    pub(crate) fn is_set(&mut self) -> bool {
        if !self.seen && self.slab.word(self.slot).load(Ordering::Acquire) == self.token {
            self.seen = true;
        }
        self.seen
    }
}

impl Drop for DeviceFlag {
    fn drop(&mut self) {
        if self.seen {
            self.slab.free.lock().push(self.slot);
        } else {
            // The write may still come: the slot is never reused and the memory never freed.
            std::mem::forget(self.slab.clone());
        }
    }
}

impl fmt::Debug for DeviceFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceFlag")
            .field("slot", &self.slot)
            .field("token", &self.token)
            .field("seen", &self.seen)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_is_set_by_its_token_only_and_its_slot_comes_back_once_seen() {
        let slab = FlagSlab::on_heap(2);
        let mut a = slab.take().unwrap();
        let mut b = slab.take().unwrap();
        assert!(slab.take().is_none(), "two slots");
        b.word().store(a.token(), Ordering::Release); // another flag's token
        assert!(!b.is_set());
        a.word().store(a.token(), Ordering::Release);
        assert!(a.is_set());
        drop(a);
        let c = slab.take().expect("a's slot came back");
        drop(b); // never seen: its slot stays out
        assert!(slab.take().is_none());
        let mut c = c;
        c.word().store(c.token(), Ordering::Release);
        assert!(c.is_set());
    }
}
