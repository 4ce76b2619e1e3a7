//! `Stream::new` on the host backend when the OS cannot start the stream's worker thread: an
//! error, not a panic. The OS refuses only under a limit that would break every other test
//! running beside it, so the test runs its other half in a process of its own.

use std::process::Command;

use streamalloc::{Device, Error, HostConfig, Stream};

/// Set in the child process, which alone may lower its limits.
const CHILD: &str = "STREAMALLOC_TEST_SPAWN_CHILD";

#[test]
#[cfg(target_os = "linux")]
fn stream_new_returns_an_error_when_no_worker_thread_can_start() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "spawn::child_creates_a_stream_under_an_address_space_limit",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "the child failed:\n{text}"
    );
    assert!(
        text.contains("refused:"),
        "the child made no stream:\n{text}"
    );
}

/// The child's half: with the address space limited to what it maps now plus 1 MiB, no
/// worker thread's stack (2 MiB) fits. Does nothing outside the child process.
#[test]
#[cfg(target_os = "linux")]
#[ignore = "the other half of stream_new_returns_an_error_when_no_worker_thread_can_start"]
fn child_creates_a_stream_under_an_address_space_limit() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let device = Device::host_with(HostConfig::default());
    // Whatever the device starts lazily, it starts now.
    let first = Stream::new(&device).unwrap();
    first.synchronize_blocking().unwrap();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `old` is a valid rlimit to write.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut old) }, 0);
    // Another thread may unmap memory between the reading and the call (the room is then more
    // than a stack): a few tries.
    for _ in 0..5 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = statm.split_whitespace().next().unwrap().parse().unwrap();
        let tight = libc::rlimit {
            rlim_cur: pages * page + (256 << 10),
            rlim_max: old.rlim_max,
        };
        // SAFETY: lowers this process's own soft limit; `tight` is a valid rlimit.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &tight) }, 0);
        let made = Stream::new(&device);
        // SAFETY: raises the soft limit back to what it was, within the hard limit.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &old) }, 0);
        match made {
            Err(e @ Error::Io { .. }) => {
                println!("refused: {e}");
                return;
            }
            Err(e) => panic!("expected an I/O error, got {e}"),
            Ok(made) => drop(made),
        }
    }
    panic!("a stream was made every time: the limit left room for a thread");
}
