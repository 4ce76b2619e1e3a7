//! The scoped current resource: across awaits and worker threads, nested, per device, not
//! inherited by spawned tasks, and taken off again when the scoped code panics.

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::test_support::device;
use crate::{
    current_device_resource_for, with_resource, with_resource_sync, CudaResource, Device,
    DeviceBuffer, MemoryResource, PoolResource, SharedResource, Stream,
};

/// A pool of `device`: a resource with an identity of its own.
fn pool(device: &Device) -> SharedResource {
    Arc::new(PoolResource::new(CudaResource::new(device).unwrap(), 0, None).unwrap())
}

/// Returns `Pending` once (waking itself), then `Ready`: an await that gives the thread back to
/// the executor.
fn yield_once() -> impl Future<Output = ()> {
    let mut yielded = false;
    std::future::poll_fn(move |cx: &mut Context<'_>| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
}

fn is_current(device: &Device, mr: &SharedResource) -> bool {
    current_device_resource_for(device).is_equal(&**mr)
}

#[test]
fn the_scope_holds_across_awaits_and_ends_with_the_future() {
    let d = device();
    let mr = pool(&d);
    let stream = Stream::new(&d).unwrap();
    let mut scoped = Box::pin(with_resource(mr.clone(), {
        let (d, mr, stream) = (d.clone(), mr.clone(), stream.clone());
        async move {
            assert!(is_current(&d, &mr));
            yield_once().await;
            stream.synchronize().await.unwrap();
            assert!(is_current(&d, &mr), "lost after an await");
            let buf = DeviceBuffer::with_current_resource(1024, &stream)
                .await
                .unwrap();
            assert!(
                buf.can_be_freed_by(&*mr),
                "allocated from {:?}",
                buf.resource()
            );
        }
    }));
    // Polled by hand: between polls (while the task is parked) the scope is off.
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(scoped.as_mut().poll(&mut cx).is_pending());
    assert!(!is_current(&d, &mr), "the scope leaked out of a poll");
    futures::executor::block_on(scoped);
    assert!(!is_current(&d, &mr));
    let outside = futures::executor::block_on(DeviceBuffer::with_current_resource(64, &stream));
    assert!(!outside.unwrap().can_be_freed_by(&*mr));
}

#[test]
fn scopes_nest_innermost_first() {
    let d = device();
    let (outer, inner) = (pool(&d), pool(&d));
    futures::executor::block_on(with_resource(outer.clone(), async {
        assert!(is_current(&d, &outer));
        with_resource(inner.clone(), async {
            yield_once().await;
            assert!(is_current(&d, &inner));
        })
        .await;
        assert!(is_current(&d, &outer), "the inner scope did not end");
        with_resource_sync(inner.clone(), || assert!(is_current(&d, &inner)));
        assert!(is_current(&d, &outer));
    }));
}

#[test]
fn a_scope_applies_only_to_its_resources_device() {
    let (d0, d1, d2) = (device(), device(), device());
    let (mr0, mr1) = (pool(&d0), pool(&d1));
    let own2 = current_device_resource_for(&d2);
    futures::executor::block_on(with_resource(mr0.clone(), async {
        assert!(!is_current(&d1, &mr0), "a scope of d0 answered for d1");
        with_resource(mr1.clone(), async {
            yield_once().await;
            assert!(is_current(&d0, &mr0), "the inner scope of d1 hid d0's");
            assert!(is_current(&d1, &mr1));
            assert!(is_current(&d2, &own2));
            let s1 = Stream::new(&d1).unwrap();
            let buf = DeviceBuffer::with_current_resource(256, &s1).await.unwrap();
            assert!(buf.can_be_freed_by(&*mr1));
            let s0 = Stream::new(&d0).unwrap();
            let buf = DeviceBuffer::with_current_resource(256, &s0).await.unwrap();
            assert!(buf.can_be_freed_by(&*mr0));
        })
        .await;
    }));
}

#[test]
fn scopes_move_with_their_tasks_across_worker_threads() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    let d = device();
    let own = current_device_resource_for(&d);
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let d = d.clone();
            let own = own.clone();
            // Every other task has no scope: it must see the device's own resource, whichever
            // scoped task ran on its thread before.
            let mr = (i % 2 == 0).then(|| pool(&d));
            rt.spawn(async move {
                let mut threads = std::collections::HashSet::new();
                let expected = mr.clone().unwrap_or(own);
                let body = async {
                    for _ in 0..200 {
                        tokio::task::yield_now().await;
                        threads.insert(std::thread::current().id());
                        assert!(is_current(&d, &expected), "another task's scope, or none");
                    }
                };
                match mr {
                    Some(mr) => with_resource(mr, body).await,
                    None => body.await,
                }
                threads.len()
            })
        })
        .collect();
    let threads: Vec<usize> = rt.block_on(async {
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    // Not asserted (scheduling decides), but reported: how many tasks changed threads.
    let moved = threads.iter().filter(|&&n| n > 1).count();
    eprintln!(
        "{moved} of {} tasks ran on more than one worker",
        threads.len()
    );
    assert!(is_current(&d, &own));
}

#[test]
fn a_spawned_task_does_not_inherit_the_scope() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let d = device();
    let mr = pool(&d);
    rt.block_on(with_resource(mr.clone(), async {
        let inside = {
            let d = d.clone();
            tokio::spawn(async move { current_device_resource_for(&d) })
        };
        let got = inside.await.unwrap();
        assert!(!got.is_equal(&*mr), "the spawned task inherited the scope");
        let wrapped = {
            let d = d.clone();
            tokio::spawn(with_resource(mr.clone(), async move {
                current_device_resource_for(&d)
            }))
        };
        assert!(wrapped.await.unwrap().is_equal(&*mr));
    }));
}

#[test]
fn a_panic_inside_takes_the_scope_off() {
    let d = device();
    let mr = pool(&d);
    let own = current_device_resource_for(&d);
    let r = panic::catch_unwind(AssertUnwindSafe(|| {
        futures::executor::block_on(with_resource(mr.clone(), async {
            yield_once().await;
            panic!("inside the scope");
        }))
    }));
    assert!(r.is_err());
    assert!(is_current(&d, &own), "the scope outlived a panicking poll");

    let r = panic::catch_unwind(AssertUnwindSafe(|| {
        with_resource_sync(mr.clone(), || panic!("inside the scope"))
    }));
    assert!(r.is_err());
    assert!(
        is_current(&d, &own),
        "the scope outlived a panicking closure"
    );

    // A tokio worker that caught a task's panic goes on without the scope.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let failed = rt.block_on(async {
        tokio::spawn(with_resource(mr.clone(), async { panic!("task") })).await
    });
    assert!(failed.is_err());
    let after = rt.block_on({
        let d = d.clone();
        async move { tokio::spawn(async move { current_device_resource_for(&d) }).await }
    });
    assert!(after.unwrap().is_equal(&*own));
}

#[test]
fn the_synchronous_scope_combines_with_the_async_one() {
    let (d0, d1) = (device(), device());
    let (mr0, mr1) = (pool(&d0), pool(&d1));
    with_resource_sync(mr0.clone(), || {
        futures::executor::block_on(with_resource(mr1.clone(), async {
            assert!(is_current(&d0, &mr0));
            assert!(is_current(&d1, &mr1));
        }));
        assert!(!is_current(&d1, &mr1));
    });
    assert!(!is_current(&d0, &mr0));
}
