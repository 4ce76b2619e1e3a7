//! Test support shared by the unit tests: fresh host devices, frees, when a stream reached a
//! point, a recording upstream (RMM's `mock_resource`) and the awaiting test every adaptor
//! passes.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::{
    CallbackResource, CudaResource, Device, DevicePtr, HostConfig, LimitingAdaptor, MemoryResource,
    Result, Stream, StreamId,
};

// Written for the integration tests, where `pub` is the crate's own visibility.
#[allow(unreachable_pub)]
#[path = "../tests/common/rng.rs"]
mod rng;
pub(crate) use rng::SplitMix64;

pub(crate) mod w4;

pub(crate) const KIB: usize = 1 << 10;
pub(crate) const MIB: usize = 1 << 20;

/// A call that reached a [`recording`] resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Allocate(usize, StreamId),
    Deallocate(DevicePtr, usize, StreamId),
}

/// The calls a [`recording`] resource has seen, in order.
pub(crate) type Calls = Arc<Mutex<Vec<Call>>>;

/// A resource of `device` that answers each request with `answer(bytes)` and records every
/// call; frees release nothing. The pointers it returns are whatever `answer` says, so tests can
/// script RMM's fake addresses.
///
/// # Safety
/// The resource keeps none of [`MemoryResource`](crate::MemoryResource)'s promise for the
/// pointers `answer` makes up (they may be no memory, or the same twice): the caller uses them
/// as numbers only, never under a container, view, kernel or copy.
pub(crate) unsafe fn recording(
    device: &Device,
    answer: impl Fn(usize) -> Result<DevicePtr> + Send + Sync + 'static,
) -> (CallbackResource, Calls) {
    let calls = Calls::default();
    let (a, d) = (calls.clone(), calls.clone());
    // SAFETY: the promise is the caller's (above): nothing touches the memory.
    let mr = unsafe {
        CallbackResource::new(
            CudaResource::new(device).unwrap().properties(),
            move |bytes, stream| {
                a.lock().push(Call::Allocate(bytes, stream.id()));
                answer(bytes)
            },
            move |ptr, bytes, stream| d.lock().push(Call::Deallocate(ptr, bytes, stream.id())),
        )
    };
    (mr, calls)
}

/// A fresh host device (its own accounting and fault injection).
pub(crate) fn device() -> Device {
    Device::host_with(HostConfig::default())
}

/// `N` fresh streams of `device`.
pub(crate) fn streams<const N: usize>(device: &Device) -> [Stream; N] {
    std::array::from_fn(|_| Stream::new(device).unwrap())
}

/// The bytes `device` (a host device) has allocated now.
pub(crate) fn allocated(device: &Device) -> usize {
    device.host_controls().unwrap().allocated_bytes()
}

/// Blocks `stream` (a host function that waits) until the returned sender is dropped: a
/// "kernel" whose end the test decides, which makes ordering tests deterministic.
pub(crate) fn gate(stream: &Stream) -> std::sync::mpsc::Sender<()> {
    let (open, wait) = std::sync::mpsc::channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = wait.recv();
        })
        .unwrap();
    open
}

/// [`gate`] that also opens by itself after `at_most`: the stream stays busy while a test
/// asserts that something did not wait for it, and opens when the test drops the sender; code
/// that waited for it makes the test fail after `at_most` instead of hanging.
pub(crate) fn hold(stream: &Stream, at_most: Duration) -> std::sync::mpsc::Sender<()> {
    let (open, wait) = std::sync::mpsc::channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = wait.recv_timeout(at_most);
        })
        .unwrap();
    open
}

/// `config` on proptest's XorShift generator instead of its default, ChaCha, which runs
/// unoptimized in test builds: it took a quarter to half of the model tests' time. As many
/// cases, drawn from the same strategies.
pub(crate) fn xorshift(config: proptest::test_runner::Config) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        rng_algorithm: proptest::test_runner::RngAlgorithm::XorShift,
        ..config
    }
}

/// A fresh host device and a stream on it.
pub(crate) fn host() -> (Device, Stream) {
    let device = device();
    let stream = Stream::new(&device).unwrap();
    (device, stream)
}

/// When `stream` reaches this point, as the host sees it (filled in by a host function).
pub(crate) type Reached = Arc<Mutex<Option<Instant>>>;

/// Marks this point of `stream`.
pub(crate) fn reached(stream: &Stream) -> Reached {
    let at = Reached::default();
    let slot = at.clone();
    stream
        .launch_host_fn(move || *slot.lock() = Some(Instant::now()))
        .unwrap();
    at
}

/// When the marked point was reached; the stream must have been synchronized since.
pub(crate) fn when(at: &Reached) -> Instant {
    at.lock().expect("the stream reached the point")
}

/// A stand-in for `ms` milliseconds of kernels on `stream` that use memory about to be freed
/// on it, and its end.
pub(crate) fn busy(stream: &Stream, ms: u64) -> Reached {
    stream.enqueue_delay(Duration::from_millis(ms)).unwrap();
    reached(stream)
}

pub(crate) fn free(mr: &impl MemoryResource, p: DevicePtr, bytes: usize, s: &Stream) {
    // SAFETY: every caller frees what it allocated from `mr` with the same size, unused.
    unsafe { mr.deallocate(p, bytes, s) }
}

/// Runs `rounds` races of a free of one of `held` (blocks of `bytes`, filling `pool`) into
/// `pool` on `freer` (a free that skips the notify when nobody is counted) against an awaited
/// allocation of `bytes` on `waiter` through `mr` (the resource, or an adaptor over it), with
/// the free at varying points of the waiter's join. Every waiter must be served.
pub(crate) fn race<R: MemoryResource + Clone + 'static>(
    mr: &R,
    pool: &impl MemoryResource,
    held: &mut Vec<DevicePtr>,
    bytes: usize,
    freer: &Stream,
    waiter: &Stream,
    rounds: usize,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut served = Vec::new();
    for round in 0..rounds {
        let task = {
            let (mr, s) = (mr.clone(), waiter.clone());
            rt.spawn(async move { mr.allocate(bytes, &s).await })
        };
        if round % 4 == 0 {
            // A quarter of the rounds free only once the waiter has queued, so that waiting is
            // exercised however the machine schedules the others.
            let queued = std::time::Instant::now();
            while mr.availability().unwrap().stats().waiting == 0 {
                assert!(
                    queued.elapsed() < Duration::from_secs(10),
                    "round {round}: never queued"
                );
                std::thread::yield_now();
            }
        } else {
            for _ in 0..(round * 37) % 2_000 {
                std::hint::spin_loop();
            }
        }
        free(pool, held.pop().unwrap(), bytes, freer);
        let p = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), task).await })
            .unwrap_or_else(|_| panic!("round {round}: the waiter was never woken"))
            .unwrap()
            .unwrap();
        served.push(p);
    }
    for p in served {
        free(mr, p, bytes, waiter);
    }
    // The rounds that waited for it queued: the resource was full.
    assert!(mr.availability().unwrap().stats().waits >= rounds as u64 / 4);
}

/// The awaiting test every adaptor passes: over a `LimitingAdaptor` of `limit` bytes, wrapped
/// by `wrap`, a request for `wait` bytes made while `held` bytes are out waits in the wait
/// queue (seen through the wrapper's forwarded availability) and resumes after the free; a
/// request larger than the wrapper's capacity limit fails at once.
///
/// Deterministic: the waiting future is polled by hand once (it must be pending and queued),
/// then the memory is freed, then it is driven to completion.
pub(crate) fn a_waiting_allocation_resumes_after_a_free<R: MemoryResource>(
    limit: usize,
    held: usize,
    wait: usize,
    wrap: impl FnOnce(LimitingAdaptor<CudaResource>) -> R,
) {
    let (device, s) = host();
    let mr = wrap(LimitingAdaptor::new(
        CudaResource::new(&device).unwrap(),
        limit,
    ));
    let availability = || {
        mr.availability()
            .expect("the adaptor forwards availability")
    };
    let first = mr.try_allocate(held, &s).unwrap();
    assert!(
        mr.try_allocate(wait, &s).unwrap_err().is_out_of_memory(),
        "the test needs the second request not to fit while the first is held"
    );

    let mut waiting = Box::pin(mr.allocate(wait, &s));
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(
        waiting.as_mut().poll(&mut cx).is_pending(),
        "a request that could fit later must wait, not fail"
    );
    assert!(availability().has_waiters());

    free(&mr, first, held, &s);
    // The oldest waiter retries on its next poll.
    let Poll::Ready(second) = waiting.as_mut().poll(&mut cx) else {
        panic!("the free did not let the waiting request through");
    };
    let second = second.expect("resumed after the free");
    drop(waiting);
    assert!(!availability().has_waiters());
    free(&mr, second, wait, &s);

    // Larger than the stack can ever hold: out-of-memory at once, even awaited. (The timeout
    // only turns a hang, which would be the bug, into a failure.)
    let limit = mr
        .capacity_limit()
        .expect("the adaptor forwards the capacity limit");
    let e =
        futures::executor::block_on(mr.allocate(limit + 1, &s).timeout(Duration::from_secs(30)))
            .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    s.synchronize_blocking().unwrap();
}

/// Whether captured backtraces name their functions: not in a stripped binary (the GPU
/// bundle's), where tests of allocation sites can only check that frames are there.
#[inline(never)]
pub(crate) fn backtraces_have_symbols() -> bool {
    std::backtrace::Backtrace::force_capture()
        .to_string()
        .contains("backtraces_have_symbols")
}

/// Whether captured backtraces give their frames' files and lines: not without debug info
/// (the release profile has `debug = false`), where only the symbol names are there.
#[inline(never)]
pub(crate) fn backtraces_have_locations() -> bool {
    std::backtrace::Backtrace::force_capture()
        .to_string()
        .contains("test_support.rs:")
}

/// A writer whose bytes a test can read while an adaptor holds it (a clone shares them).
#[derive(Clone, Default)]
pub(crate) struct SharedWriter(pub(crate) Arc<Mutex<Vec<u8>>>);

impl SharedWriter {
    /// What was written, as text.
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().clone()).unwrap()
    }
}

impl std::io::Write for SharedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
