//! A stream held busy until the test is done with it: the stand-in for long device work that
//! a test needs pending only while it asserts.

use std::sync::mpsc::{channel, Sender};
use std::time::Duration;

use streamalloc::Stream;

/// Blocks `stream` (a host function that waits) until the returned sender is dropped or
/// `at_most` has passed. A test drops the sender right after its assertions, so it lasts only
/// as long as its real work. Should the code under test wait for the held stream (the bug the
/// test looks for), the hold ends by itself and the test fails on its assertion rather than
/// hanging; `at_most` is that fallback, so it may be generous at no cost to a passing run.
///
/// On CUDA a host function blocks the one thread that runs the context's host functions: open
/// the hold before anything that needs one (a pageable copy, a host-function notification).
pub fn hold(stream: &Stream, at_most: Duration) -> Sender<()> {
    let (open, wait) = channel::<()>();
    stream
        .launch_host_fn(move || {
            let _ = wait.recv_timeout(at_most);
        })
        .unwrap();
    open
}
