//! [`FitTree`]: free ranges ordered by address, with O(log n) address-ordered first fit.
//!
//! A treap (a binary search tree by key, a max-heap by random priority, so its expected depth
//! is O(log n) whatever the order of operations) whose nodes also carry `max`, the largest
//! `size` in their subtree. First fit walks down from the root: into the left subtree when its
//! `max` is large enough (a lower address fits), else this node if it fits, else right. Every
//! operation touches one root-to-leaf path, and a size change stops climbing as soon as a
//! subtree's `max` is unchanged. Nodes live in a slab (`Vec` plus a vacant list) and are named
//! by stable `u32` ids, so callers can hold a node across other insertions and removals.

use std::fmt;

/// The null node id.
pub(crate) const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Node<V> {
    /// The start of the range; unique in the tree.
    key: u64,
    /// The length of the range (a byte or page count; the tree does not care which).
    size: u64,
    /// The largest `size` in this node's subtree, this node included.
    max: u64,
    left: u32,
    right: u32,
    /// [`NIL`] for the root. Vacant slots: [`VACANT`].
    parent: u32,
    /// Heap order: a parent's priority is at least its children's.
    prio: u32,
    value: V,
}

/// [`Node::parent`] of a slot on the vacant list (chained through [`Node::right`]).
const VACANT: u32 = u32::MAX - 1;

/// Disjoint ranges by start address, each with a payload `V`, with first fit by address. See
/// the [module documentation](self).
pub(crate) struct FitTree<V> {
    nodes: Vec<Node<V>>,
    /// The first vacant slot of `nodes`, or [`NIL`].
    vacant: u32,
    root: u32,
    len: usize,
    /// xorshift32 state for priorities; never 0.
    seed: u32,
}

impl<V> fmt::Debug for FitTree<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FitTree")
            .field("len", &self.len)
            .field("root", &self.root)
            .finish()
    }
}

impl<V: Default> Default for FitTree<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Default> FitTree<V> {
    /// An empty tree.
    pub(crate) fn new() -> Self {
        FitTree {
            nodes: Vec::new(),
            vacant: NIL,
            root: NIL,
            len: 0,
            seed: 0x9e37_79b9,
        }
    }

    /// The number of ranges.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The start of range `id`.
    pub(crate) fn key(&self, id: u32) -> u64 {
        self.nodes[id as usize].key
    }

    /// The length of range `id`.
    pub(crate) fn size(&self, id: u32) -> u64 {
        self.nodes[id as usize].size
    }

    /// The payload of range `id`.
    pub(crate) fn value(&self, id: u32) -> &V {
        &self.nodes[id as usize].value
    }

    /// The payload of range `id`, to change in place.
    pub(crate) fn value_mut(&mut self, id: u32) -> &mut V {
        &mut self.nodes[id as usize].value
    }

    /// The length of the longest range; 0 when there is none. O(1).
    pub(crate) fn max_size(&self) -> u64 {
        if self.root == NIL {
            0
        } else {
            self.nodes[self.root as usize].max
        }
    }

    /// The range with the lowest start whose length is at least `size`.
    pub(crate) fn first_fit(&self, size: u64) -> Option<u32> {
        if self.max_size() < size {
            return None;
        }
        let mut at = self.root;
        loop {
            let n = &self.nodes[at as usize];
            if n.left != NIL && self.nodes[n.left as usize].max >= size {
                at = n.left;
            } else if n.size >= size {
                return Some(at);
            } else {
                // The subtree's max is at least `size`, and neither the left side nor this
                // node has it.
                debug_assert!(n.right != NIL && self.nodes[n.right as usize].max >= size);
                at = n.right;
            }
        }
    }

    /// The ranges with the greatest start below `key` and the least start above it. `key`
    /// itself must not be a start in the tree.
    pub(crate) fn neighbours(&self, key: u64) -> (Option<u32>, Option<u32>) {
        let (mut below, mut above) = (NIL, NIL);
        let mut at = self.root;
        while at != NIL {
            let n = &self.nodes[at as usize];
            debug_assert_ne!(n.key, key, "{key:#x} is already a range start");
            if key < n.key {
                above = at;
                at = n.left;
            } else {
                below = at;
                at = n.right;
            }
        }
        (some(below), some(above))
    }

    /// The range with the least start at or above `key`.
    pub(crate) fn lower_bound(&self, key: u64) -> Option<u32> {
        let mut found = NIL;
        let mut at = self.root;
        while at != NIL {
            let n = &self.nodes[at as usize];
            if key <= n.key {
                found = at;
                at = n.left;
            } else {
                at = n.right;
            }
        }
        some(found)
    }

    /// The range that follows `id` in address order.
    pub(crate) fn next(&self, id: u32) -> Option<u32> {
        let n = &self.nodes[id as usize];
        if n.right != NIL {
            let mut at = n.right;
            while self.nodes[at as usize].left != NIL {
                at = self.nodes[at as usize].left;
            }
            return Some(at);
        }
        let mut child = id;
        let mut at = n.parent;
        while at != NIL && self.nodes[at as usize].right == child {
            child = at;
            at = self.nodes[at as usize].parent;
        }
        some(at)
    }

    /// The ids of all ranges, in address order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(self.lower_bound(0), move |&id| self.next(id))
    }

    /// Adds the range `[key, key + size)` with payload `value`; returns its id. `key` must not
    /// be a start in the tree already (the tree does not check that ranges are disjoint).
    pub(crate) fn insert(&mut self, key: u64, size: u64, value: V) -> u32 {
        let prio = self.next_prio();
        let id = self.new_node(Node {
            key,
            size,
            max: size,
            left: NIL,
            right: NIL,
            parent: NIL,
            prio,
            value,
        });
        self.len += 1;
        if self.root == NIL {
            self.root = id;
            return id;
        }
        let mut at = self.root;
        loop {
            let n = &mut self.nodes[at as usize];
            debug_assert_ne!(n.key, key, "{key:#x} is already a range start");
            n.max = n.max.max(size);
            let child = if key < n.key {
                &mut n.left
            } else {
                &mut n.right
            };
            if *child == NIL {
                *child = id;
                break;
            }
            at = *child;
        }
        self.nodes[id as usize].parent = at;
        loop {
            let p = self.nodes[id as usize].parent;
            if p == NIL || self.nodes[p as usize].prio >= prio {
                return id;
            }
            self.rotate_up(id);
        }
    }

    /// Removes range `id` and returns its payload.
    pub(crate) fn remove(&mut self, id: u32) -> V {
        // Rotate it down until it has at most one child, then splice it out.
        loop {
            let n = &self.nodes[id as usize];
            let (l, r) = (n.left, n.right);
            if l == NIL || r == NIL {
                let child = if l != NIL { l } else { r };
                let parent = n.parent;
                self.replace_child(parent, id, child);
                if child != NIL {
                    self.nodes[child as usize].parent = parent;
                }
                self.fix_up(parent);
                break;
            }
            let up = if self.nodes[l as usize].prio > self.nodes[r as usize].prio {
                l
            } else {
                r
            };
            self.rotate_up(up);
        }
        self.len -= 1;
        self.free_node(id)
    }

    /// Changes the length of range `id`.
    pub(crate) fn set_size(&mut self, id: u32, size: u64) {
        self.nodes[id as usize].size = size;
        self.fix_up(id);
    }

    /// Moves the start of range `id` to `key`, which must keep it between its neighbours.
    pub(crate) fn set_key(&mut self, id: u32, key: u64) {
        debug_assert!({
            let old = self.nodes[id as usize].key;
            let prev_ok = self.prev(id).is_none_or(|p| self.key(p) < key);
            let next_ok = self.next(id).is_none_or(|n| key < self.key(n));
            old == key || (prev_ok && next_ok)
        });
        self.nodes[id as usize].key = key;
    }

    // ---- internals ----

    fn next_prio(&mut self) -> u32 {
        let mut x = self.seed;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.seed = x;
        x
    }

    fn new_node(&mut self, node: Node<V>) -> u32 {
        if self.vacant != NIL {
            let id = self.vacant;
            self.vacant = self.nodes[id as usize].right;
            self.nodes[id as usize] = node;
            id
        } else {
            let id = u32::try_from(self.nodes.len())
                .ok()
                .filter(|&i| i < VACANT)
                .expect("too many free ranges");
            self.nodes.push(node);
            id
        }
    }

    fn free_node(&mut self, id: u32) -> V {
        let n = &mut self.nodes[id as usize];
        n.parent = VACANT;
        n.left = NIL;
        n.right = self.vacant;
        self.vacant = id;
        std::mem::take(&mut n.value)
    }

    /// The range before `id` in address order.
    fn prev(&self, id: u32) -> Option<u32> {
        let n = &self.nodes[id as usize];
        if n.left != NIL {
            let mut at = n.left;
            while self.nodes[at as usize].right != NIL {
                at = self.nodes[at as usize].right;
            }
            return Some(at);
        }
        let mut child = id;
        let mut at = n.parent;
        while at != NIL && self.nodes[at as usize].left == child {
            child = at;
            at = self.nodes[at as usize].parent;
        }
        some(at)
    }

    /// The max of `id`'s subtree from its own size and its children's maxes.
    fn subtree_max(&self, id: u32) -> u64 {
        let n = &self.nodes[id as usize];
        let mut m = n.size;
        if n.left != NIL {
            m = m.max(self.nodes[n.left as usize].max);
        }
        if n.right != NIL {
            m = m.max(self.nodes[n.right as usize].max);
        }
        m
    }

    /// Recomputes `max` from `at` up to the root, stopping where a subtree's max is unchanged
    /// (every ancestor's max is then unchanged too).
    fn fix_up(&mut self, mut at: u32) {
        while at != NIL {
            let m = self.subtree_max(at);
            if m == self.nodes[at as usize].max {
                return;
            }
            self.nodes[at as usize].max = m;
            at = self.nodes[at as usize].parent;
        }
    }

    /// Points `parent`'s link to `old` (or the root, when `parent` is [`NIL`]) at `new`.
    fn replace_child(&mut self, parent: u32, old: u32, new: u32) {
        if parent == NIL {
            self.root = new;
        } else if self.nodes[parent as usize].left == old {
            self.nodes[parent as usize].left = new;
        } else {
            debug_assert_eq!(self.nodes[parent as usize].right, old);
            self.nodes[parent as usize].right = new;
        }
    }

    /// Rotates `x` above its parent, keeping the key order and every subtree's max.
    fn rotate_up(&mut self, x: u32) {
        let p = self.nodes[x as usize].parent;
        let g = self.nodes[p as usize].parent;
        if self.nodes[p as usize].left == x {
            let b = self.nodes[x as usize].right;
            self.nodes[p as usize].left = b;
            if b != NIL {
                self.nodes[b as usize].parent = p;
            }
            self.nodes[x as usize].right = p;
        } else {
            let b = self.nodes[x as usize].left;
            self.nodes[p as usize].right = b;
            if b != NIL {
                self.nodes[b as usize].parent = p;
            }
            self.nodes[x as usize].left = p;
        }
        self.nodes[p as usize].parent = x;
        self.nodes[x as usize].parent = g;
        self.replace_child(g, p, x);
        // `x` now heads the subtree `p` headed: same ranges, same max.
        self.nodes[x as usize].max = self.nodes[p as usize].max;
        self.nodes[p as usize].max = self.subtree_max(p);
    }

    /// Checks every invariant exhaustively; panics with a description of the first broken one.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut count = 0;
        if self.root != NIL {
            assert_eq!(self.nodes[self.root as usize].parent, NIL, "root's parent");
            self.check_subtree(self.root, None, None, &mut count);
        }
        assert_eq!(count, self.len, "len");
        let mut vacant = 0;
        let mut v = self.vacant;
        while v != NIL {
            assert_eq!(self.nodes[v as usize].parent, VACANT, "vacant slot {v}");
            vacant += 1;
            v = self.nodes[v as usize].right;
        }
        assert_eq!(count + vacant, self.nodes.len(), "slots lost");
        let ordered: Vec<u64> = self.iter().map(|id| self.key(id)).collect();
        assert_eq!(ordered.len(), self.len, "in-order walk");
        assert!(ordered.windows(2).all(|w| w[0] < w[1]), "in-order walk");
    }

    #[cfg(test)]
    fn check_subtree(&self, id: u32, lo: Option<u64>, hi: Option<u64>, count: &mut usize) -> u64 {
        *count += 1;
        let n = &self.nodes[id as usize];
        assert!(lo.is_none_or(|lo| lo < n.key), "key order at {:#x}", n.key);
        assert!(hi.is_none_or(|hi| n.key < hi), "key order at {:#x}", n.key);
        let mut max = n.size;
        for child in [n.left, n.right] {
            if child == NIL {
                continue;
            }
            let c = &self.nodes[child as usize];
            assert_eq!(c.parent, id, "parent link of {:#x}", c.key);
            assert!(c.prio <= n.prio, "heap order at {:#x}", c.key);
            let (clo, chi) = if child == n.left {
                (lo, Some(n.key))
            } else {
                (Some(n.key), hi)
            };
            max = max.max(self.check_subtree(child, clo, chi, count));
        }
        assert_eq!(n.max, max, "max of {:#x}", n.key);
        max
    }
}

fn some(id: u32) -> Option<u32> {
    (id != NIL).then_some(id)
}
