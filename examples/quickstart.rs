//! The first program to run: picks a device, allocates with `.await`, hands a buffer across
//! streams, awaits an event, copies back, and says what it did and where.
//!
//! ```sh
//! cargo run --example quickstart
//! ```

use std::time::{Duration, Instant};

use streamalloc::{CudaAsyncResource, Device, DeviceBuffer, MemoryResource, Result, Stream};

const BYTES: usize = 1 << 20;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let device = Device::default();
    let info = device.memory_info()?;
    println!(
        "device {} ({}, {} backend): {} MiB free of {} MiB",
        device.id(),
        device.name(),
        device.backend(),
        info.free >> 20,
        info.total >> 20
    );

    // A stream-ordered pool of the driver's; on the host backend, its emulation.
    let mr = CudaAsyncResource::new(&device)?;
    let (producer, consumer) = (Stream::new(&device)?, Stream::new(&device)?);

    // Allocation is a future; when memory is there it completes on the first poll.
    let t = Instant::now();
    let raw = mr.allocate(BYTES, &producer).await?;
    println!(
        "allocated {BYTES} bytes at {raw} with .await in {:?}",
        t.elapsed()
    );
    // SAFETY: allocated just above from `mr` with the same size; nothing uses it.
    unsafe { mr.deallocate(raw, BYTES, &producer) };

    // A buffer owned by the producer stream, written there by "a kernel": 20 ms of device work
    // (a spin kernel on CUDA, a delay on the host backend) followed by a fill.
    let mut buf = DeviceBuffer::new(BYTES, &producer, mr.clone()).await?;
    producer.enqueue_delay(Duration::from_millis(20))?;
    buf.fill(42)?;
    let written = producer.record()?;

    // Hand it to the consumer stream: the consumer's later work waits for the producer's
    // work on the buffer. No host thread blocks.
    buf.set_stream(&consumer)?;
    println!(
        "handed the buffer from {} to {}; producer done yet: {}",
        producer.id(),
        consumer.id(),
        written.is_complete()?
    );

    // Await an event: the task sleeps until the device passes it.
    let t = Instant::now();
    written.await?;
    println!(
        "awaited the producer's event for {:?} ({:?} strategy)",
        t.elapsed(),
        device.completion_strategy()
    );

    // Copy back on the consumer stream; the host Vec is handed back when the copy is done.
    let host = buf.copy_to_host(vec![0u8; BYTES]).await?;
    let all_42 = host.iter().all(|&b| b == 42);
    println!(
        "copied {} bytes back on {}: every byte is 42: {all_42}",
        host.len(),
        consumer.id()
    );
    assert!(all_42, "the consumer saw data the producer had not written");

    drop(buf); // a stream-ordered free on the consumer stream; nothing blocks
    consumer.synchronize().await?;
    if let Some(e) = device.take_deferred_error() {
        return Err(e);
    }
    println!("done on the {} backend", device.backend());
    Ok(())
}
