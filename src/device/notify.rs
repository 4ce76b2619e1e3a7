//! The completion driver: the one place that turns device progress into task wake-ups.
//!
//! Two strategies, selectable per device (figures in the book's "Completion driver" page):
//! - [`CompletionStrategy::HostFunction`]: a private *shadow stream* per user stream waits for
//!   the event, then runs a host function that sets the flag and wakes the tasks. The user
//!   stream never runs the host function itself, so it never stalls behind it.
//! - [`CompletionStrategy::Poller`]: one thread per device queries the oldest pending event of
//!   each stream (events on a stream complete in order), spins briefly, then backs off and
//!   parks when nothing is pending.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, Thread};
use std::time::Duration;

use parking_lot::Mutex;

use crate::backend::{AnyBackend, AnyEvent, AnyStream, Completion};
use crate::device::config::CompletionStrategy;
use crate::error::Result;
use crate::ids::StreamId;

/// Per-device state of the completion driver.
pub(crate) struct CompletionDriver {
    strategy: AtomicU8,
    poller: OnceLock<Poller>,
}

impl CompletionDriver {
    pub(crate) fn new(strategy: CompletionStrategy) -> Self {
        CompletionDriver {
            strategy: AtomicU8::new(strategy.to_u8()),
            poller: OnceLock::new(),
        }
    }

    pub(crate) fn strategy(&self) -> CompletionStrategy {
        CompletionStrategy::from_u8(self.strategy.load(Ordering::Relaxed))
    }

    pub(crate) fn set_strategy(&self, strategy: CompletionStrategy) {
        self.strategy.store(strategy.to_u8(), Ordering::Relaxed)
    }

    /// Arranges for `completion` to be completed once `event` is: `event` was recorded on the
    /// stream `stream`, whose shadow stream (created on `backend` when first needed) runs the
    /// host function.
    pub(crate) fn arm(
        &self,
        backend: &AnyBackend,
        stream: StreamId,
        shadow: &ShadowStream,
        event: &AnyEvent,
        completion: &Arc<Completion>,
    ) -> Result<()> {
        match self.strategy() {
            CompletionStrategy::HostFunction => {
                let shadow = shadow.get_or_create(backend)?;
                shadow.wait_event(event)?;
                shadow.notify(completion.clone())
            }
            CompletionStrategy::Poller => {
                let poller = self.poller.get_or_init(Poller::start);
                poller.submit(stream, event.clone(), completion.clone());
                Ok(())
            }
        }
    }
}

impl Drop for CompletionDriver {
    /// Stops the poller and waits for it, so that it queries no event after the device is
    /// gone (unless the device's last handle drops on the poller itself, through a waker).
    fn drop(&mut self) {
        if let Some(p) = self.poller.take() {
            p.shared.shutdown.store(true, Ordering::Release);
            p.thread.unpark();
            if p.thread.id() != thread::current().id() {
                let _ = p.handle.join();
            }
        }
    }
}

impl fmt::Debug for CompletionDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionDriver")
            .field("strategy", &self.strategy())
            .finish()
    }
}

/// The private stream on which the host-function notifications of one user stream run, so a
/// user stream never stalls behind a host callback. Created on first use; the user stream's
/// handle owns it, so it lives exactly as long.
#[derive(Debug, Default)]
pub(crate) struct ShadowStream(OnceLock<AnyStream>);

impl ShadowStream {
    fn get_or_create(&self, backend: &AnyBackend) -> Result<&AnyStream> {
        if let Some(s) = self.0.get() {
            return Ok(s);
        }
        let created = backend.create_stream()?;
        // A racing thread may have set it first; keep theirs and drop ours.
        Ok(self.0.get_or_init(|| created))
    }
}

type Pending = (AnyEvent, Arc<Completion>);

struct Poller {
    shared: Arc<PollerShared>,
    thread: Thread,
    /// Joined when the device goes.
    handle: std::thread::JoinHandle<()>,
}

struct PollerShared {
    inbox: Mutex<Vec<(StreamId, Pending)>>,
    shutdown: AtomicBool,
}

/// Rounds without progress spent spinning, then yielding, before the poller sleeps.
const SPIN_ROUNDS: u32 = 200;
const YIELD_ROUNDS: u32 = 400;
/// The longest sleep between two polls while events are pending.
const MAX_SLEEP: Duration = Duration::from_micros(500);

impl Poller {
    fn start() -> Poller {
        let shared = Arc::new(PollerShared {
            inbox: Mutex::new(Vec::new()),
            shutdown: AtomicBool::new(false),
        });
        let for_thread = shared.clone();
        let handle = thread::Builder::new()
            .name("streamalloc-poller".into())
            .spawn(move || poll_loop(&for_thread))
            .expect("failed to spawn the completion poller thread");
        Poller {
            shared,
            thread: handle.thread().clone(),
            handle,
        }
    }

    fn submit(&self, stream: StreamId, event: AnyEvent, completion: Arc<Completion>) {
        self.shared.inbox.lock().push((stream, (event, completion)));
        self.thread.unpark();
    }
}

fn poll_loop(shared: &PollerShared) {
    let mut queues: HashMap<StreamId, VecDeque<Pending>> = HashMap::new();
    let mut idle_rounds = 0u32;
    loop {
        for (stream, pending) in shared.inbox.lock().drain(..) {
            queues.entry(stream).or_default().push_back(pending);
        }
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        let mut progressed = false;
        for queue in queues.values_mut() {
            // Events on one stream complete in order: query only the oldest.
            while let Some((event, completion)) = queue.front() {
                match event.query() {
                    Ok(false) => break,
                    Ok(true) => completion.complete(),
                    Err(e) => completion.fail(e),
                }
                queue.pop_front();
                progressed = true;
            }
        }
        queues.retain(|_, q| !q.is_empty());
        if queues.is_empty() {
            idle_rounds = 0;
            if shared.inbox.lock().is_empty() {
                thread::park();
            }
            continue;
        }
        idle_rounds = if progressed {
            0
        } else {
            idle_rounds.saturating_add(1)
        };
        if idle_rounds < SPIN_ROUNDS {
            std::hint::spin_loop();
        } else if idle_rounds < YIELD_ROUNDS {
            thread::yield_now();
        } else {
            let exp = (idle_rounds - YIELD_ROUNDS).min(9);
            thread::sleep(Duration::from_micros(1 << exp).min(MAX_SLEEP));
        }
    }
}
