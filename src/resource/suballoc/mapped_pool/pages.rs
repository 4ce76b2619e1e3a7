//! The pages of a mapped pool's range: mapping them under blocks, fencing wholly free ones
//! with events, and releasing them once their streams have passed those events.

use std::sync::Arc;

use super::free_list::Owners;
use super::page_state::{Page, PendingRelease, Status};
use super::{Inner, State};
use crate::error::Result;
use crate::stream::Event;

/// The default release policy keeps wholly free pages mapped while the mapped memory is at
/// most the peak of live bytes plus 1/`KEEP_DIVISOR` of it and one page: whatever the pool
/// holds, it has needed (nearly) all of it at once, so W4's peak footprint stays within a few
/// percent of its peak of live bytes, while blocks of any size reuse pages mapped for others
/// (the driver calls of mapping and unmapping a page cost microseconds each on a GPU).
const KEEP_DIVISOR: u64 = 32;

impl Inner {
    /// Creates physical memory for the unmapped pages `run` and maps them (one page per
    /// handle, so that each can be released alone). When the device is out of memory, first
    /// releases every idle page (none under the request: `serve` claimed those) and tries
    /// again. On failure nothing of the run stays mapped or created.
    pub(super) fn map_run(&self, state: &mut State, run: std::ops::Range<usize>) -> Result<()> {
        let raw = self.device.raw();
        let g = self.granularity;
        let mut handles = Vec::with_capacity(run.len());
        let mut failure = None;
        for _ in run.clone() {
            let mut created = raw.vmm_create(g);
            if matches!(&created, Err(e) if e.is_out_of_memory()) {
                // Idle pages hold physical memory the device may need: release them all.
                self.collect(state, 0, 0);
                created = raw.vmm_create(g);
            }
            match created {
                Ok(h) => handles.push(h),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if failure.is_none() {
            let va = self.base + (run.start * g) as u64;
            // SAFETY: the run is pages of the pool's own reservation (aligned, inside it), all
            // `Unmapped` (the caller found them so); each handle was just created with `g`
            // bytes, once.
            match unsafe { raw.vmm_map(va, g, &handles) } {
                Ok(()) => {
                    for (i, &handle) in run.zip(&handles) {
                        state.pages[i] = Page::Mapped {
                            handle,
                            status: Status::InUse,
                        };
                        state.mapped_pages += 1;
                    }
                    self.mapped_bytes
                        .store(state.mapped_pages * g, std::sync::atomic::Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) => failure = Some(e),
            }
        }
        for h in handles {
            // SAFETY: created above, never mapped (or unmapped again by the failed map).
            if let Err(e) = unsafe { raw.vmm_release(h, g) } {
                self.device.defer_error(e);
            }
        }
        Err(failure.expect("failed"))
    }

    /// Gives pages that `serve` claimed for a request it could not serve back their status
    /// (a pending release that completed meanwhile makes them idle).
    pub(super) fn unclaim(state: &mut State, claimed: Vec<(usize, Status)>) {
        for (i, status) in claimed {
            let Page::Mapped { handle, .. } = state.pages[i] else {
                continue;
            };
            let status = match status {
                Status::Pending(id) if !state.pending.iter().any(|p| p.id == id) => Status::Idle,
                other => other,
            };
            match status {
                Status::Idle => {
                    state.idle.insert(i);
                }
                Status::Unfenced => {
                    state.unfenced.insert(i);
                }
                Status::InUse | Status::Pending(_) => {}
            }
            state.pages[i] = Page::Mapped { handle, status };
        }
    }

    /// Unmaps page `index` and releases its physical memory; false (and the error deferred)
    /// when the driver refused to unmap, in which case the page stays mapped, `Idle`, and the
    /// caller puts it back in `idle`.
    pub(super) fn release_page(&self, state: &mut State, index: usize) -> bool {
        let Page::Mapped { handle, .. } = state.pages[index] else {
            return true;
        };
        let raw = self.device.raw();
        let g = self.granularity;
        let va = self.base + (index * g) as u64;
        // SAFETY: the page is one mapping made by `map_run`; it is wholly free and every
        // stream that freed into it has passed those frees (status `Idle`, see `collect`), so
        // no queued or running work uses it.
        if let Err(e) = unsafe { raw.vmm_unmap(va, g) } {
            self.device.defer_error(e);
            // Still wholly free and fenced: the caller keeps it idle, for the next release to
            // try again.
            state.pages[index] = Page::Mapped {
                handle,
                status: Status::Idle,
            };
            return false;
        }
        state.pages[index] = Page::Unmapped;
        state.mapped_pages -= 1;
        self.mapped_bytes
            .store(state.mapped_pages * g, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: unmapped just above, mapped nowhere else, released once.
        if let Err(e) = unsafe { raw.vmm_release(handle, g) } {
            self.device.defer_error(e);
        }
        true
    }

    /// The wholly free pages (idle or unfenced) kept mapped, and the low-water mark a release
    /// goes down to: with a release threshold, its pages and half of them; by default, what
    /// keeps the mapped pages within the cap of [`KEEP_DIVISOR`] (pages pending release
    /// count as mapped until they go), and a 32nd of the cap below that.
    pub(super) fn keep_pages(&self, state: &State) -> (usize, usize) {
        match self.release_threshold {
            Some(bytes) => {
                let high = bytes / self.granularity;
                (high, high / 2)
            }
            None => {
                let g = self.granularity as u64;
                let peak = state.peak_live;
                let cap = ((peak + peak / KEEP_DIVISOR).div_ceil(g) + 1) as usize;
                let free = state.idle.len() + state.unfenced.len();
                let outside = self.outside_bytes().div_ceil(g) as usize;
                let high = (cap + free).saturating_sub(state.mapped_pages + outside);
                (high, high.saturating_sub(cap / KEEP_DIVISOR as usize))
            }
        }
    }

    /// Makes pages whose pending frees have completed idle; when the wholly free pages
    /// (idle or unfenced) are more than `high`, fences the unfenced ones and releases idle
    /// pages, those nearest the middle of the range first, until at most `low` stay mapped.
    /// Returns the bytes released.
    pub(super) fn collect(&self, state: &mut State, high: usize, low: usize) -> usize {
        if state.idle.len() + state.unfenced.len() > high && !state.unfenced.is_empty() {
            let pages: Vec<usize> = std::mem::take(&mut state.unfenced).into_iter().collect();
            self.fence(state, pages);
        }
        let mut pending = std::mem::take(&mut state.pending);
        pending.retain(|p| {
            // An event that reports an error is not done: the stream failed, and on a GPU
            // its work before the event may still be running. The release is given up: the
            // pages stay mapped, as pages in use do, and the error goes to the device.
            let (status, done) = match passed(&p.events) {
                Ok(false) => return true,
                Ok(true) => (Status::Idle, true),
                Err(e) => {
                    self.device.defer_error(e);
                    (Status::InUse, false)
                }
            };
            for i in p.pages.clone() {
                if let Page::Mapped {
                    handle,
                    status: Status::Pending(id),
                } = state.pages[i]
                {
                    if id == p.id {
                        state.pages[i] = Page::Mapped { handle, status };
                        if done {
                            state.idle.insert(i);
                        }
                    }
                }
            }
            false
        });
        state.pending = pending;
        if state.idle.len() + state.unfenced.len() <= high {
            return 0;
        }
        let mut released = 0;
        let mut failed = Vec::new();
        // Blocks are placed from both ends of the range (small ones at the top, large ones at
        // the bottom): the pages nearest its middle are the last a request would reach.
        let middle = state.pages.len() / 2;
        while state.idle.len() > low {
            let i = take_nearest(&mut state.idle, middle).expect("more than 0 idle pages");
            if self.release_page(state, i) {
                released += self.granularity;
            } else {
                failed.push(i);
            }
        }
        state.idle.extend(failed);
        released
    }

    /// Makes each stream with pages pending release wake the wait queue once it passes their
    /// frees: a request that failed may be served by those pages' physical memory, and no
    /// free may ever come to wake it otherwise. Only on this slow path, once per release.
    pub(super) fn arm_wakeups(&self, state: &mut State) {
        for p in state.pending.iter_mut().filter(|p| !p.armed) {
            p.armed = true;
            for e in &p.events {
                let availability = Arc::clone(&self.availability);
                // The host function only wakes wakers: no driver call.
                if let Err(err) = e.stream().launch_host_fn(move || availability.notify()) {
                    self.device.defer_error(err);
                }
            }
        }
    }

    /// Puts `pages` (wholly free: emptied by a free, or unfenced) up for release once every
    /// stream that freed into their free blocks passes an event recorded now. On a driver
    /// error recording one, the pages stay as they were (mapped, and used again like any free
    /// memory) and the error is deferred.
    pub(super) fn fence(&self, state: &mut State, pages: Vec<usize>) {
        let (Some(&low), Some(&high)) = (pages.first(), pages.last()) else {
            return;
        };
        let g = self.granularity as u64;
        let mut owners = Owners::default();
        let mut last_block = None;
        for &i in &pages {
            if let Some((start, _, o)) = state.list.block_containing(i as u64 * g) {
                if last_block != Some(start) {
                    owners.join(o);
                    last_block = Some(start);
                }
            }
        }
        let mut events = Vec::new();
        for o in owners.iter() {
            match state.orders[o as usize].stream().record() {
                Ok(e) => events.push(e),
                Err(e) => {
                    self.device.defer_error(e);
                    for &i in &pages {
                        if matches!(
                            state.pages[i],
                            Page::Mapped {
                                status: Status::Unfenced,
                                ..
                            }
                        ) {
                            state.unfenced.insert(i);
                        }
                    }
                    return;
                }
            }
        }
        let id = state.next_pending;
        state.next_pending = id.checked_add(1).expect("2^64 page releases");
        for &i in &pages {
            if let Page::Mapped { handle, status } = state.pages[i] {
                debug_assert!(
                    matches!(status, Status::InUse | Status::Unfenced),
                    "page {i} fenced twice"
                );
                state.pages[i] = Page::Mapped {
                    handle,
                    status: Status::Pending(id),
                };
            }
        }
        state.pending.push(PendingRelease {
            id,
            pages: low..high + 1,
            events,
            armed: false,
        });
    }
}

/// Takes the page of `pages` nearest to `to` out of it.
fn take_nearest(pages: &mut std::collections::BTreeSet<usize>, to: usize) -> Option<usize> {
    let below = pages.range(..to).next_back().copied();
    let above = pages.range(to..).next().copied();
    let i = match (below, above) {
        (Some(b), Some(a)) => {
            if to - b <= a - to {
                b
            } else {
                a
            }
        }
        (b, a) => b.or(a)?,
    };
    pages.remove(&i);
    Some(i)
}

/// Whether the streams have passed every one of `events`; the first error an event reports
/// (its stream failed) is no answer.
fn passed(events: &[Event]) -> Result<bool> {
    for e in events {
        if !e.is_complete()? {
            return Ok(false);
        }
    }
    Ok(true)
}
