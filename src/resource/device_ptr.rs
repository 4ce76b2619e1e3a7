//! [`DevicePtr`]: an address that resources hand out.

use std::fmt;

/// An address in device (or device-visible) memory. A plain number: holding one owns nothing.
///
/// # Examples
///
/// ```
/// use streamalloc::DevicePtr;
///
/// let p = DevicePtr::from_raw(0x1000);
/// assert_eq!(p.offset(0x100).addr(), 0x1100);
/// assert!(p.is_aligned(256));
/// assert!(DevicePtr::NULL.is_null());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DevicePtr(u64);

impl DevicePtr {
    /// The null pointer, which resources return for 0-byte allocations.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// Wraps a raw address (a `CUdeviceptr`).
    pub const fn from_raw(addr: u64) -> Self {
        DevicePtr(addr)
    }

    /// The raw address (a `CUdeviceptr`).
    pub const fn addr(self) -> u64 {
        self.0
    }

    /// True for [`DevicePtr::NULL`].
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address `bytes` further on.
    ///
    /// # Panics
    /// On address overflow, which no valid allocation reaches.
    pub fn offset(self, bytes: usize) -> Self {
        DevicePtr(
            self.0
                .checked_add(bytes as u64)
                .expect("device pointer overflow"),
        )
    }

    /// Whether the address is a multiple of `align`.
    pub fn is_aligned(self, align: usize) -> bool {
        self.0 % align as u64 == 0
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.0)
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}
