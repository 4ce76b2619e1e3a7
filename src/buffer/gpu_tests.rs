//! The hand-off proof on a GPU, with its negative control: it needs the crate-private switch
//! that turns the automatic waits off ([`DeviceBuffer::disable_handoff_waits`]), so it lives
//! here rather than in `tests/cuda/` (which keeps the kernel-written proof of the public API).
//! Ignored where there is no GPU; the GPU bundle runs this binary with `--include-ignored`.
//!
//! The scenario: stream A first runs a kernel that spins 200 ms (the CUDA backend's
//! [`enqueue_delay`](Stream::enqueue_delay)), then writes the buffer; the buffer moves to
//! stream B, and B copies it to the host at once.

use std::time::Duration;

use futures::executor::block_on;

use crate::{CudaAsyncResource, Device, DeviceBuffer, Stream};

/// Bytes of the buffer: a copy of them takes a few milliseconds, far less than the spin.
const BYTES: usize = 16 << 20;
/// What the buffer holds before A's write.
const OLD: u8 = 0x11;

/// Runs the scenario; returns what B read. A writes `value` after its spin.
fn write_on_a_then_move_to_b(value: u8, automatic_wait: bool) -> Vec<u8> {
    let device = Device::cuda(0).expect("these tests need CUDA device 0");
    let mr = CudaAsyncResource::new(&device).unwrap();
    let (a, b) = (Stream::new(&device).unwrap(), Stream::new(&device).unwrap());
    let mut buf = DeviceBuffer::try_new(BYTES, &a, mr).unwrap();
    buf.fill(OLD).unwrap();
    a.synchronize_blocking().unwrap();
    a.enqueue_delay(Duration::from_millis(200)).unwrap();
    buf.fill(value).unwrap();
    if !automatic_wait {
        // SAFETY: the race this allows is the point of the test: B only reads, and A is
        // drained below before the buffer is freed.
        unsafe { buf.disable_handoff_waits() };
    }
    buf.set_stream(&b).unwrap();
    let host = block_on(buf.copy_to_host(vec![0u8; BYTES])).unwrap();
    a.synchronize_blocking().unwrap();
    host
}

#[test]
#[ignore = "needs a CUDA device"]
fn handoff_orders_b_after_a_write_behind_a_kernel() {
    let host = write_on_a_then_move_to_b(0xab, true);
    let wrong = host.iter().filter(|&&x| x != 0xab).count();
    assert_eq!(
        wrong, 0,
        "{wrong} of {BYTES} bytes were read before A wrote them"
    );
}

/// The negative control of the test above (and of `tests/cuda`'s kernel-written proof): with
/// the automatic wait switched off, B copies while A's kernel still spins, so the host sees
/// bytes A has not written yet. This shows the hand-off tests can fail.
#[test]
#[ignore = "needs a CUDA device"]
fn handoff_without_the_automatic_wait_reads_stale_data() {
    let host = write_on_a_then_move_to_b(0x5c, false);
    let stale = host.iter().filter(|&&x| x == OLD).count();
    assert!(stale > 0, "every byte was written: the race did not show");
    println!("without the wait, {stale} of {BYTES} bytes were stale");
}
