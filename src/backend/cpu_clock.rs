//! The CPU's time-stamp counter, for clocks that read the time often: a read is one
//! instruction (`rdtsc`), against a `clock_gettime` for `SystemTime::now`. Here, with the
//! backend, because reading it is an intrinsic the compiler calls `unsafe`.

/// The time-stamp counter, where there is one to read.
#[inline]
pub(crate) fn ticks() -> Option<u64> {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // SAFETY: `rdtsc` is part of every x86-64 CPU's instruction set and only reads the
        // counter; it touches no memory.
        Some(unsafe { std::arch::x86_64::_rdtsc() })
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        None
    }
}

/// Whether the counter can stand for the system's time: the kernel keeps time with it
/// (clocksource `tsc`, which it uses only where the counter runs at a constant rate and agrees
/// across cores), or it could (`tsc` is among the clocksources, as in virtual machines that
/// keep time by `kvm-clock`) and the CPU says the counter is invariant. A counter that
/// disagrees a little across cores shifts times a little, never the lines' order, which the
/// lock keeps, and the writer never lets times go back.
pub(crate) fn system_keeps_time_by_ticks() -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    let read = |name: &str| {
        std::fs::read_to_string(format!(
            "/sys/devices/system/clocksource/clocksource0/{name}"
        ))
        .unwrap_or_default()
    };
    if read("current_clocksource").trim() == "tsc" {
        return true;
    }
    let invariant = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
        info.lines()
            .find(|line| line.starts_with("flags"))
            .is_some_and(|flags| {
                let has = |flag| flags.split_whitespace().any(|w| w == flag);
                has("constant_tsc") && has("nonstop_tsc")
            })
    });
    invariant
        && read("available_clocksource")
            .split_whitespace()
            .any(|c| c == "tsc")
}
