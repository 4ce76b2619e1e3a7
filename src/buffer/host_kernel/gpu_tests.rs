//! Host kernels on a CUDA device: refused, since its memory is not host-accessible. Ignored
//! where there is no GPU; the GPU bundle runs this binary with `--include-ignored`.

use crate::{CudaAsyncResource, Device, DeviceBuffer, Error, Stream};

#[test]
#[ignore = "needs a CUDA device"]
fn a_host_kernel_on_a_cuda_stream_is_unsupported() {
    let device = Device::cuda(0).expect("these tests need CUDA device 0");
    let stream = Stream::new(&device).unwrap();
    let mut buf =
        DeviceBuffer::try_new(64, &stream, CudaAsyncResource::new(&device).unwrap()).unwrap();
    let other = Stream::new(&device).unwrap();
    let err = other
        .launch_host_kernel(buf.host_write(), |_| panic!("must not run"))
        .unwrap_err();
    assert!(
        matches!(&err, Error::Unsupported { device: d, .. } if *d == device.id()),
        "{err}"
    );
    assert_eq!(buf.stream(), stream, "nothing was tracked");
    stream.synchronize_blocking().unwrap();
    assert!(device.take_deferred_error().is_none());
}
