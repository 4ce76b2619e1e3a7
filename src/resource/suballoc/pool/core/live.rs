//! The core's map of allocated blocks (start address → slab slot), with the most recent
//! allocation held in front of the hash map.
//!
//! The pool's fast path is an allocation freed soon after (W1: each block is freed before the
//! next is allocated), so the newest allocation sits in one field and only goes into the hash
//! map when another allocation comes: a block freed before the next allocation never touches
//! the map (no hash insert, no hash remove: about 140 instructions of a ~850-instruction pair).
//! Every operation keeps the two disjoint, so the map's contents are `front` plus `map`.

use rustc_hash::FxHashMap;

/// Start address → slab slot of every allocated block.
#[derive(Default)]
pub(super) struct LiveMap {
    /// The latest allocation, unless it was freed (or pushed into `map`) since.
    front: Option<(u64, u32)>,
    /// Every other allocated block.
    map: FxHashMap<u64, u32>,
}

impl LiveMap {
    /// Adds the allocated block `idx` at `addr`, which must not be in the map.
    #[inline]
    pub(super) fn insert(&mut self, addr: u64, idx: u32) {
        debug_assert!(self.get(addr).is_none(), "{addr:#x} allocated twice");
        if let Some((a, i)) = self.front.replace((addr, idx)) {
            self.map.insert(a, i);
        }
    }

    /// The slot of the allocated block at `addr`.
    #[inline]
    pub(super) fn get(&self, addr: u64) -> Option<u32> {
        match self.front {
            Some((a, i)) if a == addr => Some(i),
            _ => self.map.get(&addr).copied(),
        }
    }

    /// Takes the allocated block at `addr` out of the map; its slot.
    #[inline]
    pub(super) fn remove(&mut self, addr: u64) -> Option<u32> {
        match self.front {
            Some((a, i)) if a == addr => {
                self.front = None;
                Some(i)
            }
            _ => self.map.remove(&addr),
        }
    }

    /// How many allocated blocks there are.
    pub(super) fn len(&self) -> usize {
        self.map.len() + usize::from(self.front.is_some())
    }

    /// Every allocated block's slot.
    #[cfg(test)]
    pub(super) fn values(&self) -> impl Iterator<Item = &u32> + '_ {
        self.front.iter().map(|(_, i)| i).chain(self.map.values())
    }
}

#[cfg(test)]
mod tests {
    use super::LiveMap;

    /// The front entry and the map behave as one map: whatever the order of inserts and
    /// removes, each address is found until removed, once, and `len` counts both parts.
    #[test]
    fn front_and_map_act_as_one_map() {
        let mut live = LiveMap::default();
        live.insert(0x100, 1);
        assert_eq!((live.get(0x100), live.len()), (Some(1), 1));
        live.insert(0x200, 2); // pushes 0x100 into the hash map
        live.insert(0x300, 3);
        assert_eq!(live.len(), 3);
        assert_eq!(
            live.remove(0x100),
            Some(1),
            "an older block, from the hash map"
        );
        assert_eq!(live.remove(0x100), None, "a second remove finds nothing");
        assert_eq!(live.remove(0x300), Some(3), "the front");
        assert_eq!(live.remove(0x300), None, "the front, a second time");
        assert_eq!(live.get(0x200), Some(2));
        assert_eq!(live.len(), 1);
        let mut values: Vec<u32> = live.values().copied().collect();
        values.sort_unstable();
        assert_eq!(values, [2]);
        live.insert(0x300, 4);
        assert_eq!(live.get(0x300), Some(4));
        assert_eq!(live.get(0x400), None);
        assert_eq!(live.len(), 2);
    }
}
