//! Streams whose owner is gone while cudarc handles to them are still alive: each `CUstream` is
//! kept until only this list holds its cudarc handle, then destroyed.

use std::sync::Arc;

use cudarc::driver::sys;
use parking_lot::Mutex;

use super::context::DeviceContext;
use super::handles::RawStream;

/// A stream whose owner is gone while cudarc handles to it were still alive: destroyed by
/// [`sweep_retired_streams`] once only this list holds its cudarc handle.
struct Retired {
    outside: Arc<cudarc::driver::CudaStream>,
    ctx: Arc<DeviceContext>,
    raw: RawStream,
}

/// Streams waiting for their last cudarc handle to go.
static RETIRED: Mutex<Vec<Retired>> = Mutex::new(Vec::new());

/// Keeps `raw` (created by `cuStreamCreate` in `ctx`, its owner gone) until `outside`, a
/// cudarc handle to it, is the last one.
pub(super) fn retire_stream(
    outside: Arc<cudarc::driver::CudaStream>,
    ctx: Arc<DeviceContext>,
    raw: RawStream,
) {
    RETIRED.lock().push(Retired { outside, ctx, raw });
}

/// Destroys every retired stream that no cudarc handle refers to any more. Called whenever a
/// stream is created or handed to cudarc, so at most the streams retired since then wait.
pub(crate) fn sweep_retired_streams() {
    let done: Vec<Retired> = {
        let mut retired = RETIRED.lock();
        if retired.is_empty() {
            return;
        }
        let (done, keep) = std::mem::take(&mut *retired)
            .into_iter()
            // The list holds the only handle: no one can clone it any more.
            .partition(|r| Arc::strong_count(&r.outside) == 1);
        *retired = keep;
        done
    };
    for r in done {
        drop(r.outside);
        if !r.ctx.bind_in_drop("a retired stream") {
            continue;
        }
        // SAFETY: `raw` was created by `cuStreamCreate` in `ctx`, its owner is gone and the
        // last cudarc handle to it was just dropped (borrowed handles never destroy it), so
        // nothing can enqueue on it again; queued work runs to completion.
        let r2 = unsafe { sys::cuStreamDestroy_v2(r.raw.0) };
        if let Err(error) = r.ctx.check("cuStreamDestroy", r2) {
            r.ctx.errors().report(error);
        }
    }
}
