//! Forwarding written once: the part of [`MemoryResource`] that a resource over an upstream
//! does not change.
//!
//! RMM's `shared_resource<detail::X_impl>` is the model. A resource over an upstream (every
//! adaptor, the sub-allocators) is a public handle, `X { inner: Arc<Inner> }`, over its shared
//! state, which holds the upstream in a field `upstream`. The state implements [`Forward`]
//! (an unsafe trait: it carries [`MemoryResource`]'s promise) with only what the resource
//! changes (an adaptor's allocate and free, a budget's capacity
//! limit); every method it leaves out forwards to the upstream. One line,
//! `memory_resource!(shared [R: MemoryResource] X<R>);`, then writes the rest: the state's
//! [`Wraps`], the handle's `Clone`, its `upstream()` accessor and its [`MemoryResource`] impl,
//! whose identity is the shared state ([`ResourceIdentity::of_shared`]), so a clone is the same
//! resource. Each resource's file holds its own behaviour and nothing else.
//!
//! ```text
//! pub struct CountingAdaptor<R: MemoryResource = SharedResource> {
//!     inner: Arc<Inner<R>>,
//! }
//!
//! struct Inner<R> {
//!     upstream: R,
//!     count: AtomicUsize,
//! }
//!
//! memory_resource!(shared [R: MemoryResource] CountingAdaptor<R>);
//!
//! // SAFETY: it returns what the upstream returned, and keeps its properties.
//! unsafe impl<R: MemoryResource> Forward for Inner<R> {
//!     fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
//!         self.count.fetch_add(1, Relaxed);
//!         self.upstream.try_allocate(bytes, stream)
//!     }
//! }
//! ```
//!
//! The second form, `memory_resource!(delegate [..] T, |this| expr)`, is for a type that is
//! another resource under a new name (`Arc<R>`, [`CudaAsyncResource`] over its view).
//!
//! [`ResourceIdentity::of_shared`]: crate::resource::contract::properties::ResourceIdentity::of_shared
//! [`CudaAsyncResource`]: crate::CudaAsyncResource

use crate::error::Result;
use crate::resource::contract::availability::Availability;
use crate::resource::contract::memory_resource::MemoryResource;
use crate::resource::contract::properties::Properties;
use crate::resource::contract::stats::MemoryStats;
use crate::resource::device_ptr::DevicePtr;
use crate::resource::inspect::{Fragmentation, MemorySnapshot};
use crate::stream::Stream;

/// The shared state's upstream: `memory_resource!(shared ..)` implements it from the state's
/// `upstream` field, so that a [`Forward`] impl holds only what the resource changes.
pub(crate) trait Wraps {
    /// The wrapped resource.
    type Upstream: MemoryResource;

    /// The wrapped resource, which gets whatever this one does not change.
    fn upstream(&self) -> &Self::Upstream;
}

/// The shared state of a resource over an upstream: what it changes of the
/// [`MemoryResource`] contract, the rest forwarded to its [`upstream`](Wraps::upstream).
///
/// The methods mean what [`MemoryResource`]'s of the same names mean.
///
/// # Safety
/// The handle's `MemoryResource` impl that `memory_resource!(shared ..)` writes is this
/// state's, so an implementor keeps [`MemoryResource`]'s promise (see its `# Safety`) for
/// what [`try_allocate`](Forward::try_allocate) returns and what
/// [`properties`](Forward::properties) says. The defaults keep it by forwarding the
/// upstream's, which keeps it itself (an unsafe trait too); a state that overrides either
/// says in its impl's `// SAFETY:` comment why the promise still holds.
pub(crate) unsafe trait Forward: Wraps {
    #[inline]
    fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        self.upstream().try_allocate(bytes, stream)
    }

    /// # Safety
    /// As [`MemoryResource::deallocate`].
    #[inline]
    unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
        // SAFETY: forwarded from the caller's contract; the pointer is the upstream's own.
        unsafe { self.upstream().deallocate(ptr, bytes, stream) }
    }

    fn availability(&self) -> Option<&Availability> {
        self.upstream().availability()
    }

    fn capacity_limit(&self) -> Option<usize> {
        self.upstream().capacity_limit()
    }

    fn may_regain_memory(&self, bytes: usize) -> bool {
        self.upstream().may_regain_memory(bytes)
    }

    fn properties(&self) -> Properties {
        self.upstream().properties()
    }

    /// The upstream's figures; a layer that counts or holds memory puts its own over them. The
    /// wait queue is filled in by the handle, from its own [`availability`](Forward::availability).
    fn memory_stats(&self) -> MemoryStats {
        self.upstream().memory_stats()
    }

    /// Resets the peaks below; a layer with peaks of its own resets them too.
    fn reset_peak(&self) {
        self.upstream().reset_peak()
    }

    /// The upstream's picture; a sub-allocator gives its own, a tracking layer adds sites.
    fn snapshot(&self) -> Option<MemorySnapshot> {
        self.upstream().snapshot()
    }

    fn fragmentation(&self) -> Option<Fragmentation> {
        self.upstream().fragmentation()
    }
}

/// Writes a [`MemoryResource`] impl that is pure forwarding.
///
/// - `memory_resource!(shared [R: MemoryResource] Handle<R>);` for a handle
///   `Handle<R> { inner: Arc<Inner<R>> }` whose `Inner<R>` holds the upstream in its field
///   `upstream: R` and implements [`Forward`]: the state's [`Wraps`], the handle's `Clone` (a
///   clone shares the state), its public `upstream()` accessor, and its `MemoryResource` impl,
///   each method the state's, the identity the state's address.
/// - `memory_resource!(delegate [generics] Type, |this| expr);` for a type that *is* the
///   resource `expr` reaches from `this` (`&Self`): every method, identity included, is that
///   resource's.
macro_rules! memory_resource {
    (shared [$($generics:tt)*] $handle:ident<$r:ident>) => {
        impl<$($generics)*> $crate::resource::contract::forward::Wraps for Inner<$r> {
            type Upstream = $r;

            fn upstream(&self) -> &$r {
                &self.upstream
            }
        }

        impl<$($generics)*> $handle<$r> {
            /// The upstream resource, which this one wraps.
            pub fn upstream(&self) -> &$r {
                &self.inner.upstream
            }
        }

        impl<$($generics)*> ::std::clone::Clone for $handle<$r> {
            fn clone(&self) -> Self {
                $handle {
                    inner: ::std::sync::Arc::clone(&self.inner),
                }
            }
        }

        $crate::resource::contract::forward::memory_resource!(
            @impl [$($generics)*] $handle<$r>,
            |this| (&*this.inner),
            identity: $crate::resource::contract::properties::ResourceIdentity::of_shared(&this.inner)
        );
    };

    (delegate [$($generics:tt)*] $ty:ty, |$this:ident| $to:expr) => {
        $crate::resource::contract::forward::memory_resource!(
            @impl [$($generics)*] $ty,
            |$this| $to,
            identity: $to.identity()
        );
    };

    // `$to` names the resource (a `MemoryResource`, or a `Forward` state) that each method
    // goes to; `$identity` is the identity, both read with `$this` bound to `self`.
    (@impl [$($generics:tt)*] $ty:ty, |$this:ident| $to:expr, identity: $identity:expr) => {
        const _: () = {
            // Brings the `Forward` methods of a handle's state in reach of `$to.method()`.
            #[allow(unused_imports)]
            use $crate::resource::contract::forward::Forward as _;
            use $crate::error::Result;
            use $crate::resource::contract::availability::Availability;
            use $crate::resource::device_ptr::DevicePtr;
            use $crate::resource::contract::memory_resource::MemoryResource;
            use $crate::resource::contract::properties::{Properties, ResourceIdentity};
            use $crate::resource::contract::stats::MemoryStats;
            use $crate::resource::inspect::{Fragmentation, MemorySnapshot};
            use $crate::stream::Stream;

            // SAFETY: every method is `$to`'s: a resource's (`delegate`), or the shared
            // state's (`shared`), whose `Forward` impl promises the same (an unsafe trait
            // with `MemoryResource`'s contract); the identity is no part of the promise.
            unsafe impl<$($generics)*> MemoryResource for $ty {
                #[inline]
                fn try_allocate(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
                    let $this = self;
                    $to.try_allocate(bytes, stream)
                }

                #[inline]
                unsafe fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) {
                    let $this = self;
                    // SAFETY: forwarded from the caller's contract.
                    unsafe { $to.deallocate(ptr, bytes, stream) }
                }

                fn availability(&self) -> Option<&Availability> {
                    let $this = self;
                    $to.availability()
                }

                fn capacity_limit(&self) -> Option<usize> {
                    let $this = self;
                    $to.capacity_limit()
                }

                fn may_regain_memory(&self, bytes: usize) -> bool {
                    let $this = self;
                    $to.may_regain_memory(bytes)
                }

                fn identity(&self) -> ResourceIdentity {
                    let $this = self;
                    $identity
                }

                fn properties(&self) -> Properties {
                    let $this = self;
                    $to.properties()
                }

                fn memory_stats(&self) -> MemoryStats {
                    let $this = self;
                    let mut stats = $to.memory_stats();
                    // The queue that awaited allocations through this resource join.
                    if let Some(a) = self.availability() {
                        stats.wait_queue = a.stats();
                    }
                    stats
                }

                fn reset_peak(&self) {
                    let $this = self;
                    $to.reset_peak()
                }

                fn snapshot(&self) -> Option<MemorySnapshot> {
                    let $this = self;
                    $to.snapshot()
                }

                fn fragmentation(&self) -> Option<Fragmentation> {
                    let $this = self;
                    $to.fragmentation()
                }
            }
        };
    };
}

pub(crate) use memory_resource;

// A shared resource is the resource it shares.
memory_resource!(delegate [R: MemoryResource + ?Sized] std::sync::Arc<R>, |this| &**this);
// A borrowed resource is the resource it borrows: adaptors can wrap a resource the caller
// keeps (a replay stacks its recording adaptors over the resource it is given).
memory_resource!(delegate ['a, R: MemoryResource + ?Sized] &'a R, |this| &**this);
