use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use futures::executor::block_on;

use super::{HostRead, HostWrite};
use crate::test_support::{allocated, device, gate, streams};
use crate::{CudaResource, DeviceBuffer, DeviceVec, Error, Stream};

fn buffer(bytes: usize, stream: &Stream) -> DeviceBuffer {
    DeviceBuffer::try_new(bytes, stream, CudaResource::new(stream.device()).unwrap()).unwrap()
}

fn to_host(buf: &DeviceBuffer) -> Vec<u8> {
    block_on(buf.copy_to_host(vec![0u8; buf.len()])).unwrap()
}

/// Long enough for unordered work on another stream's worker to have run.
const SETTLE: Duration = Duration::from_millis(50);

// ---- correctness ----------------------------------------------------------------------------

#[test]
fn kernel_reads_and_writes_typed_views() {
    let d = device();
    let [s] = streams(&d);
    let mut a = buffer(16, &s);
    let mut c = buffer(16, &s);
    s.launch_host_kernel(a.host_write(), |a: &mut [u8]| {
        for (i, x) in a.iter_mut().enumerate() {
            *x = i as u8;
        }
    })
    .unwrap();
    // Inferred closure parameters from a tuple of arguments.
    s.launch_host_kernel((a.host_read(), c.host_write()), |(a, c)| {
        for (c, a) in c.iter_mut().zip(a) {
            *c = a * 3;
        }
    })
    .unwrap();
    assert_eq!(to_host(&c), (0..16).map(|i| i * 3).collect::<Vec<u8>>());
    assert!(d.take_deferred_error().is_none());
}

#[test]
fn typed_sub_ranges_see_the_right_elements() {
    let d = device();
    let [s] = streams(&d);
    let mut buf = buffer(64, &s);
    // 8 u32 at byte 16 (elements 4..12 of 16).
    s.launch_host_kernel(HostWrite::<u32>::new(&mut buf, 16, 8), |v: &mut [u32]| {
        assert_eq!(v.len(), 8);
        v.fill(0x0101_0101);
    })
    .unwrap();
    let (tx, rx) = mpsc::channel();
    let args = (
        HostRead::<u32>::new(&buf, 0, 16),
        (HostRead::<u8>::new(&buf, 16, 1),),
    );
    s.launch_host_kernel(args, move |(all, (first,)): (&[u32], (&[u8],))| {
        tx.send((all.to_vec(), first.to_vec())).unwrap()
    })
    .unwrap();
    let (all, first) = rx.recv().unwrap();
    let expected: Vec<u32> = (0..16)
        .map(|i| if (4..12).contains(&i) { 0x0101_0101 } else { 0 })
        .collect();
    assert_eq!(all, expected);
    assert_eq!(first, [1]);
    assert!(d.take_deferred_error().is_none());
}

#[test]
fn typed_vectors_and_their_views() {
    let d = device();
    let [s, t] = streams(&d);
    let mr = CudaResource::new(&d).unwrap();
    let x = block_on(DeviceVec::from_host(
        vec![1.0f32, 2.0, 3.0, 4.0],
        &s,
        mr.clone(),
    ))
    .unwrap();
    let mut y = block_on(DeviceVec::<f32>::zeroed(6, &s, mr)).unwrap();
    // y[1..5] = 10 * x, on `t`: the write to a view hands the whole vector over.
    t.launch_host_kernel(
        (
            x.slice(..).unwrap().host_read(),
            y.slice_mut(1..5).unwrap().host_write(),
        ),
        |(x, y)| y.iter_mut().zip(x).for_each(|(y, x)| *y = 10.0 * x),
    )
    .unwrap();
    assert_eq!(y.stream(), t);
    // Two read views of one vector in one launch are fine.
    let (tx, rx) = mpsc::channel();
    s.launch_host_kernel(
        (
            y.slice(..2).unwrap().host_read(),
            y.slice(4..).unwrap().host_read(),
        ),
        move |(head, tail)| tx.send((head.to_vec(), tail.to_vec())).unwrap(),
    )
    .unwrap();
    assert_eq!(rx.recv().unwrap(), (vec![0.0, 10.0], vec![40.0, 0.0]));
    assert_eq!(
        block_on(y.to_vec()).unwrap(),
        [0.0, 10.0, 20.0, 30.0, 40.0, 0.0]
    );
    assert!(d.take_deferred_error().is_none());
}

#[test]
fn zero_length_arguments_get_empty_slices() {
    let d = device();
    let [s] = streams(&d);
    let mut a = buffer(0, &s);
    let b = buffer(0, &s);
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    s.launch_host_kernel((a.host_write(), b.host_read()), move |(a, b)| {
        assert!(a.is_empty() && b.is_empty());
        flag.store(true, Ordering::SeqCst);
    })
    .unwrap();
    s.synchronize_blocking().unwrap();
    assert!(ran.load(Ordering::SeqCst));
    assert!(d.take_deferred_error().is_none());
}

#[test]
fn eight_arguments_in_order() {
    let d = device();
    let [s] = streams(&d);
    let mut bufs: Vec<DeviceBuffer> = (0..8).map(|_| buffer(1, &s)).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        b.fill(i as u8).unwrap();
    }
    let (tx, rx) = mpsc::channel();
    let [b0, b1, b2, b3, b4, b5, b6, b7] = &bufs[..] else {
        unreachable!()
    };
    let args = (
        b0.host_read(),
        b1.host_read(),
        b2.host_read(),
        b3.host_read(),
        b4.host_read(),
        b5.host_read(),
        b6.host_read(),
        b7.host_read(),
    );
    s.launch_host_kernel(args, move |(a, b, c, d, e, f, g, h)| {
        tx.send([a, b, c, d, e, f, g, h].map(|x| x[0])).unwrap()
    })
    .unwrap();
    assert_eq!(rx.recv().unwrap(), [0, 1, 2, 3, 4, 5, 6, 7]);
}

// ---- ordering -------------------------------------------------------------------------------

#[test]
fn a_read_on_b_waits_for_the_write_on_a() {
    let d = device();
    let [a, b] = streams(&d);
    let mut x = buffer(4096, &a);
    let open = gate(&a);
    a.launch_host_kernel(x.host_write(), |x: &mut [u8]| x.fill(7))
        .unwrap();
    let (tx, rx) = mpsc::channel();
    b.launch_host_kernel(x.host_read(), move |x: &[u8]| {
        tx.send(x.iter().all(|&v| v == 7)).unwrap()
    })
    .unwrap();
    std::thread::sleep(SETTLE);
    assert!(
        rx.try_recv().is_err(),
        "the reader on b ran before a's write was done"
    );
    drop(open);
    assert!(rx.recv().unwrap(), "the reader on b saw stale data");
}

#[test]
fn a_later_write_on_a_waits_for_the_read_on_b() {
    let d = device();
    let [a, b] = streams(&d);
    let mut x = buffer(4096, &a);
    x.fill(1).unwrap();
    let open = gate(&b);
    let (tx, rx) = mpsc::channel();
    b.launch_host_kernel(x.host_read(), move |x: &[u8]| {
        tx.send(x.iter().all(|&v| v == 1)).unwrap()
    })
    .unwrap();
    // The owner writes again, with a host kernel and with a fill: both must wait for b's read.
    a.launch_host_kernel(x.host_write(), |x: &mut [u8]| x.fill(2))
        .unwrap();
    x.fill(3).unwrap();
    std::thread::sleep(SETTLE);
    drop(open);
    assert!(
        rx.recv().unwrap(),
        "a overwrote data b's kernel was reading"
    );
    assert!(to_host(&x).iter().all(|&v| v == 3));
}

#[test]
fn a_write_on_c_waits_for_the_owner_and_the_readers() {
    let d = device();
    let [a, r, c] = streams(&d);
    let mut x = buffer(4096, &a);
    let open_a = gate(&a);
    x.fill(1).unwrap();
    let open_r = gate(&r);
    let (tx, rx) = mpsc::channel();
    r.launch_host_kernel(x.host_read(), move |x: &[u8]| {
        tx.send(x.iter().all(|&v| v == 1)).unwrap()
    })
    .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    c.launch_host_kernel(x.host_write(), move |x: &mut [u8]| {
        x.fill(2);
        flag.store(true, Ordering::SeqCst);
    })
    .unwrap();
    assert_eq!(x.stream(), c, "a write argument hands the buffer over");
    std::thread::sleep(SETTLE);
    assert!(!done.load(Ordering::SeqCst), "c wrote before a's fill");
    drop(open_a);
    std::thread::sleep(SETTLE);
    assert!(!done.load(Ordering::SeqCst), "c wrote under r's read");
    drop(open_r);
    assert!(rx.recv().unwrap(), "r's read saw c's write");
    assert!(to_host(&x).iter().all(|&v| v == 2));
}

#[test]
fn drop_waits_for_the_writer_and_the_reader() {
    let d = device();
    let [a, b] = streams(&d);
    let mut x = buffer(1 << 16, &a);
    let open_a = gate(&a);
    a.launch_host_kernel(x.host_write(), |x: &mut [u8]| x.fill(1))
        .unwrap();
    let open_b = gate(&b);
    b.launch_host_kernel(x.host_read(), |x: &[u8]| assert!(x.iter().all(|&v| v == 1)))
        .unwrap();
    drop(x); // must neither block nor free under the kernels
    std::thread::sleep(SETTLE);
    assert_eq!(allocated(&d), 1 << 16, "freed under a's write");
    drop(open_a); // `a` runs its write, then its free waits for `b`
    std::thread::sleep(SETTLE);
    assert_eq!(allocated(&d), 1 << 16, "freed under b's read");
    drop(open_b);
    b.synchronize_blocking().unwrap();
    a.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), 0);
    assert!(
        d.take_deferred_error().is_none(),
        "b's kernel saw a's write"
    );
}

#[test]
fn forgetting_handles_never_frees_early() {
    // Arguments have no drop to forget (they only borrow until the launch). A read kernel whose
    // stream handle is dropped, and whose buffer is dropped at once, still holds the free back.
    let d = device();
    let [a, b] = streams(&d);
    let x = buffer(1 << 16, &a);
    let open = gate(&b);
    b.launch_host_kernel(x.host_read(), |x: &[u8]| assert!(x.iter().all(|&v| v == 0)))
        .unwrap();
    drop(b);
    drop(x);
    std::thread::sleep(SETTLE);
    assert_eq!(allocated(&d), 1 << 16, "freed under the read");
    drop(open);
    // The free on `a` waits for b's kernel; a sync of `a` covers it.
    a.synchronize_blocking().unwrap();
    assert_eq!(allocated(&d), 0);
    assert!(d.take_deferred_error().is_none());
}

// ---- errors ---------------------------------------------------------------------------------

#[test]
fn an_argument_of_another_device_is_a_device_mismatch() {
    let (d0, d1) = (device(), device());
    let [s0] = streams(&d0);
    let [s1] = streams(&d1);
    let mut own = buffer(8, &s0);
    let other = buffer(8, &s1);
    let err = s0
        .launch_host_kernel((own.host_write(), other.host_read()), |_| {
            panic!("must not run")
        })
        .unwrap_err();
    assert_eq!(
        err,
        Error::DeviceMismatch {
            expected: d1.id(),
            actual: d0.id(),
            call: "a host kernel's buffer argument, on its launch stream",
        }
    );
    // Checked before anything was tracked: the first argument kept its owner.
    assert_eq!(own.stream(), s0);
    s0.synchronize_blocking().unwrap();
    assert!(d0.take_deferred_error().is_none());
}

#[test]
fn out_of_range_and_misaligned_arguments_are_invalid() {
    let d = device();
    let [s, t] = streams(&d);
    let mut buf = buffer(64, &s);
    let err = s
        .launch_host_kernel(HostRead::<u32>::new(&buf, 4, 16), |_| ())
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("16 elements of 4 bytes at byte 4")),
        "{err}"
    );
    let err = s
        .launch_host_kernel(HostRead::<u32>::new(&buf, usize::MAX, 1), |_| ())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let err = t
        .launch_host_kernel(HostWrite::<u32>::new(&mut buf, 2, 1), |_| ())
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("not aligned to 4")),
        "{err}"
    );
    assert_eq!(
        buf.stream(),
        s,
        "a refused write argument is not handed over"
    );
}

#[test]
fn a_panicking_kernel_is_a_deferred_error_and_the_stream_goes_on() {
    let d = device();
    let [s] = streams(&d);
    let mut x = buffer(8, &s);
    s.launch_host_kernel(x.host_write(), |x: &mut [u8]| {
        x[0] = 5;
        panic!("kernel bug {}", 42);
    })
    .unwrap();
    let (tx, rx) = mpsc::channel();
    s.launch_host_kernel(x.host_read(), move |x: &[u8]| tx.send(x[0]).unwrap())
        .unwrap();
    assert_eq!(rx.recv().unwrap(), 5, "the later kernel did not run");
    let err = d.take_deferred_error().expect("the panic was reported");
    assert!(
        matches!(&err, Error::InvalidArgument(m)
            if m.contains("host kernel panicked") && m.contains("kernel bug 42")),
        "{err}"
    );
    assert!(d.take_deferred_error().is_none(), "reported once");
}
