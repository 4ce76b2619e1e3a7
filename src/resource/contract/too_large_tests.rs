//! Out-of-memory that can never fit: `Error::TooLarge` with the maximum, from `try_allocate`
//! and from the awaited path, apart from "does not fit now".

use crate::test_support::free;
use crate::{
    ArenaResource, CallbackResource, CudaResource, Device, Error, FixedSizeResource, HostConfig,
    LimitingAdaptor, MemoryResource, PoolResource, StatisticsAdaptor, Stream,
};

const KIB: usize = 1024;
const MIB: usize = 1 << 20;

fn device(capacity: usize) -> (Device, Stream) {
    let device = Device::host_with(HostConfig::default().capacity(capacity));
    let stream = Stream::new(&device).unwrap();
    (device, stream)
}

fn assert_too_large(e: &Error, requested: usize, maximum: usize) {
    assert!(
        matches!(e, Error::TooLarge { requested: r, maximum: m, .. } if *r == requested && *m == maximum),
        "{e:?}"
    );
    assert!(e.is_out_of_memory() && e.never_fits());
    let text = e.to_string();
    assert!(
        text.contains("never fit") && text.contains(&maximum.to_string()),
        "{text}"
    );
    assert!(!text.contains("available"), "{text}");
}

#[tokio::test]
async fn a_pool_says_a_request_above_its_maximum_can_never_fit() {
    let (device, s) = device(64 * MIB);
    let pool = PoolResource::new(CudaResource::new(&device).unwrap(), 0, Some(MIB)).unwrap();
    assert_too_large(&pool.try_allocate(2 * MIB, &s).unwrap_err(), 2 * MIB, MIB);
    assert_too_large(&pool.allocate(2 * MIB, &s).await.unwrap_err(), 2 * MIB, MIB);
    // Within the maximum but not now: plain out-of-memory, with what is available.
    let held = pool.try_allocate(MIB, &s).unwrap();
    let e = pool.try_allocate(KIB, &s).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfMemory {
                requested: KIB,
                available: Some(0),
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!e.never_fits());
    free(&pool, held, MIB, &s);
}

#[tokio::test]
async fn a_budget_says_so_through_adaptors() {
    let (device, s) = device(64 * MIB);
    let mr = StatisticsAdaptor::new(LimitingAdaptor::new(
        CudaResource::new(&device).unwrap(),
        4 * KIB,
    ));
    assert_too_large(&mr.try_allocate(8 * KIB, &s).unwrap_err(), 8 * KIB, 4 * KIB);
    assert_too_large(
        &mr.allocate(8 * KIB, &s).await.unwrap_err(),
        8 * KIB,
        4 * KIB,
    );
}

#[test]
fn a_device_leaf_says_so_above_the_device_memory() {
    let (device, s) = device(MIB);
    let mr = CudaResource::new(&device).unwrap();
    assert_too_large(&mr.try_allocate(2 * MIB, &s).unwrap_err(), 2 * MIB, MIB);
}

#[test]
fn fixed_size_and_arena_say_so_above_their_limits() {
    let (device, s) = device(64 * MIB);
    let fixed = FixedSizeResource::new(CudaResource::new(&device).unwrap(), KIB, 4).unwrap();
    assert_too_large(&fixed.try_allocate(KIB + 1, &s).unwrap_err(), KIB + 1, KIB);
    let arena = ArenaResource::new(CudaResource::new(&device).unwrap(), Some(4 * MIB)).unwrap();
    let limit = arena.capacity_limit().unwrap();
    assert_too_large(
        &arena.try_allocate(limit + 1, &s).unwrap_err(),
        limit + 1,
        limit,
    );
}

#[tokio::test]
async fn an_awaited_request_above_any_resources_limit_is_too_large() {
    // A resource of the user's that only knows plain out-of-memory.
    let (device, s) = device(64 * MIB);
    let id = device.id();
    // SAFETY: it hands out no pointer: every answer is an error.
    let mr = unsafe {
        CallbackResource::new(
            CudaResource::new(&device).unwrap().properties(),
            move |bytes, _| Err(Error::out_of_memory(bytes, Some(0), id)),
            |_, _, _| {},
        )
    }
    .with_capacity_limit(MIB);
    assert_too_large(&mr.allocate(2 * MIB, &s).await.unwrap_err(), 2 * MIB, MIB);
}
