//! [`SharedResource`]: a resource behind one type, for stacks composed at run time.

use std::sync::Arc;

use super::memory_resource::MemoryResource;

/// A type-erased, shared resource: what per-device defaults, containers and runtime-composed
/// stacks hold.
pub type SharedResource = Arc<dyn MemoryResource>;

/// Type-erases a resource; a [`SharedResource`] passes through as it is instead of being
/// wrapped a second time.
pub(crate) fn into_shared<R: MemoryResource + 'static>(mr: R) -> SharedResource {
    let mut slot = Some(mr);
    if let Some(shared) =
        (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<SharedResource>>()
    {
        return shared.take().expect("filled above");
    }
    Arc::new(slot.expect("filled above"))
}
