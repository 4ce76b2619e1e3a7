//! Many tokio tasks awaiting one bounded resource, with cancellations and deadlines: shared by
//! the pool and arena suites.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use streamalloc::{Device, DevicePtr, Error, MemoryResource, Stream};

use super::SplitMix64;

/// How the tasks of [`awaiting_tasks`] ended.
#[derive(Debug)]
pub struct Outcome {
    pub served: usize,
    pub timed_out: usize,
    pub cancelled: usize,
    pub elapsed: Duration,
}

/// `tasks` tokio tasks on 4 streams draw random sizes from `mr` (seeded by `seed`), with total
/// demand 3× `capacity` and none above a quarter of it; each served task holds its memory for
/// 1–21 ms. 20 % of the futures are dropped at random points and 30 % carry deadlines. With
/// `cross_stream`, every other task frees on the next stream (after that stream waits for the
/// allocating one), so memory crosses streams. Panics on any error but a timeout, and when a
/// task hangs for 60 s (a deadlock or lost wake-up); the streams are drained at the end.
pub fn awaiting_tasks<R>(
    device: &Device,
    mr: R,
    capacity: usize,
    tasks: usize,
    seed: u64,
    cross_stream: bool,
) -> Outcome
where
    R: MemoryResource + Clone + 'static,
{
    let mut rng = SplitMix64(seed);
    // Sizes averaging 3 × capacity / tasks, none above a quarter of the capacity.
    let mean = 3 * capacity / tasks;
    let plans: Vec<(usize, u64, bool, Option<u64>)> = (0..tasks)
        .map(|_| {
            let size = 256 + (rng.next() as usize % (2 * mean)).min(capacity / 4);
            let hold_us = 1000 + rng.next() % 20_000;
            let cancel = rng.next() % 100 < 20;
            let deadline_ms = (rng.next() % 100 < 30).then(|| 5 + rng.next() % 50);
            (size, hold_us, cancel, deadline_ms)
        })
        .collect();
    let served = Arc::new(AtomicUsize::new(0));
    let timed_out = Arc::new(AtomicUsize::new(0));
    let cancelled = Arc::new(AtomicUsize::new(0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let start = Instant::now();
    rt.block_on(async {
        let streams: Vec<Stream> = (0..4).map(|_| Stream::new(device).unwrap()).collect();
        let handles: Vec<_> = plans
            .into_iter()
            .enumerate()
            .map(|(i, (size, hold_us, cancel, deadline_ms))| {
                let (mr, s) = (mr.clone(), streams[i % 4].clone());
                let f = streams[(i + usize::from(cross_stream && i % 2 == 1)) % 4].clone();
                let (served, timed_out, cancelled) =
                    (served.clone(), timed_out.clone(), cancelled.clone());
                tokio::spawn(async move {
                    let mut request = mr.allocate(size, &s);
                    if let Some(ms) = deadline_ms {
                        request = request.timeout(Duration::from_millis(ms));
                    }
                    let outcome = if cancel {
                        // Dropped at a random point: at once, or after some waiting.
                        tokio::time::timeout(Duration::from_micros(hold_us), request).await
                    } else {
                        Ok(request.await)
                    };
                    match outcome {
                        Err(_elapsed) => {
                            cancelled.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(Ok(p)) => {
                            tokio::time::sleep(Duration::from_micros(hold_us)).await;
                            if f != s {
                                f.wait(&s.record().unwrap()).unwrap();
                            }
                            free(&mr, p, size, &f);
                            served.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(Err(Error::Timeout { .. })) => {
                            timed_out.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(Err(e)) => panic!("task {i}: unexpected error {e}"),
                    }
                })
            })
            .collect();
        for t in handles {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("a task hung: deadlock or lost wake-up")
                .unwrap();
        }
        for s in &streams {
            s.synchronize().await.unwrap();
        }
    });
    let outcome = Outcome {
        served: served.load(Ordering::SeqCst),
        timed_out: timed_out.load(Ordering::SeqCst),
        cancelled: cancelled.load(Ordering::SeqCst),
        elapsed: start.elapsed(),
    };
    assert_eq!(
        outcome.served + outcome.timed_out + outcome.cancelled,
        tasks,
        "{outcome:?}"
    );
    assert!(
        !mr.availability().unwrap().has_waiters(),
        "waiters left in the queue"
    );
    outcome
}

fn free(mr: &impl MemoryResource, p: DevicePtr, bytes: usize, s: &Stream) {
    // SAFETY: every task frees what it allocated from `mr` with the same size, unused, on a
    // stream ordered after the allocating one.
    unsafe { mr.deallocate(p, bytes, s) }
}
