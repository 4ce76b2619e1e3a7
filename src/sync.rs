//! Every lock and atomic of the concurrency-critical parts (the wait queue) comes from here, so
//! `--cfg loom` swaps in loom's model-checked versions.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::Arc;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;

/// A mutex with parking_lot's panic-free `lock()`, over loom's mutex under `--cfg loom`.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T> {
    #[cfg(loom)]
    inner: loom::sync::Mutex<T>,
    #[cfg(not(loom))]
    inner: parking_lot::Mutex<T>,
}

impl<T> Mutex<T> {
    #[cfg(loom)]
    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.inner
            .lock()
            .expect("a thread panicked while holding a wait-queue lock")
    }

    #[cfg(not(loom))]
    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, T> {
        self.inner.lock()
    }
}
