//! [`FitTree`]: free ranges ordered by address, with O(log n) address-ordered first fit.
//!
//! A B+tree of fanout 32 whose inner nodes keep, for each child, the smallest start and the
//! largest length below it. First fit walks down from the root, at each level into the first
//! child whose largest length is large enough (a lower address fits), and stops at the first
//! entry of the leaf that fits. With 32 entries per node the tree stays a few levels deep (three
//! for tens of thousands of ranges) and every node is a few contiguous arrays, so a walk costs
//! a few cache misses; a binary tree of the same ranges is five times deeper, one miss a level.
//!
//! Positions ([`Pos`]) name an entry (or an insertion point) until the next insertion or
//! removal; changing an entry's start or length in place keeps every position valid. Nodes are
//! never merged when they shrink: a leaf that empties is unlinked, and the root collapses when
//! it has one child, so the height never exceeds what the largest size of the tree needed.

use std::fmt;

/// Entries (and children) per node.
const B: usize = 32;
/// The null node id.
const NIL: u32 = u32::MAX;

/// An entry of a leaf, or the place where an entry would be inserted: valid until the next
/// insertion or removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos {
    leaf: u32,
    index: usize,
}

/// The neighbourhood of a start that is not in the tree ([`FitTree::near`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Near {
    /// Where an entry with that start goes.
    pub(crate) at: Pos,
    /// The entry with the greatest start below it.
    pub(crate) below: Option<Pos>,
    /// The entry with the least start above it.
    pub(crate) above: Option<Pos>,
}

struct Leaf<V> {
    len: usize,
    keys: [u64; B],
    sizes: [u64; B],
    values: [V; B],
    parent: u32,
    /// Its index among `parent`'s children.
    slot: u32,
    /// The leaves in key order, as a doubly linked list.
    prev: u32,
    next: u32,
}

struct Inner {
    len: usize,
    /// The smallest start under each child.
    keys: [u64; B],
    /// The largest length under each child.
    maxes: [u64; B],
    /// Leaf ids at height 1, inner node ids above.
    children: [u32; B],
    parent: u32,
    /// Its index among `parent`'s children.
    slot: u32,
}

/// Disjoint ranges by start address, each with a payload `V`, with first fit by address. See
/// the [module documentation](self).
pub(crate) struct FitTree<V> {
    leaves: Vec<Leaf<V>>,
    vacant_leaves: Vec<u32>,
    inners: Vec<Inner>,
    vacant_inners: Vec<u32>,
    /// A leaf when `height` is 0, else an inner node; [`NIL`] when the tree is empty.
    root: u32,
    height: u32,
    len: usize,
}

impl<V> fmt::Debug for FitTree<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FitTree")
            .field("len", &self.len)
            .field("height", &self.height)
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
            leaves: Vec::new(),
            vacant_leaves: Vec::new(),
            inners: Vec::new(),
            vacant_inners: Vec::new(),
            root: NIL,
            height: 0,
            len: 0,
        }
    }

    /// The number of ranges.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The start and length of the entry at `pos`.
    pub(crate) fn entry(&self, pos: Pos) -> (u64, u64) {
        let leaf = &self.leaves[pos.leaf as usize];
        debug_assert!(pos.index < leaf.len, "{pos:?} is not an entry");
        (leaf.keys[pos.index], leaf.sizes[pos.index])
    }

    /// The payload of the entry at `pos`.
    pub(crate) fn value(&self, pos: Pos) -> &V {
        &self.leaves[pos.leaf as usize].values[pos.index]
    }

    /// The payload of the entry at `pos`, to change in place.
    pub(crate) fn value_mut(&mut self, pos: Pos) -> &mut V {
        &mut self.leaves[pos.leaf as usize].values[pos.index]
    }

    /// The length of the longest range; 0 when there is none.
    pub(crate) fn max_size(&self) -> u64 {
        if self.root == NIL {
            0
        } else if self.height == 0 {
            self.leaf_max(self.root)
        } else {
            let n = &self.inners[self.root as usize];
            max_of(&n.maxes[..n.len])
        }
    }

    /// The range with the lowest start whose length is at least `size`.
    pub(crate) fn first_fit(&self, size: u64) -> Option<Pos> {
        if self.root == NIL {
            return None;
        }
        let mut at = self.root;
        for _ in 0..self.height {
            let n = &self.inners[at as usize];
            let i = first_at_least(&n.maxes[..n.len], size)?;
            at = n.children[i];
        }
        let leaf = &self.leaves[at as usize];
        let index = first_at_least(&leaf.sizes[..leaf.len], size)?;
        Some(Pos { leaf: at, index })
    }

    /// Where a range starting at `key` (not a start in the tree) goes, and its neighbours.
    pub(crate) fn near(&self, key: u64) -> Near {
        if self.root == NIL {
            return Near {
                at: Pos {
                    leaf: NIL,
                    index: 0,
                },
                below: None,
                above: None,
            };
        }
        let at = self.seek(key);
        let leaf = &self.leaves[at.leaf as usize];
        debug_assert!(
            at.index == leaf.len || leaf.keys[at.index] != key,
            "{key:#x} is already a range start"
        );
        let above = if at.index < leaf.len {
            Some(at)
        } else {
            self.first_of(leaf.next)
        };
        let below = if at.index > 0 {
            Some(Pos {
                leaf: at.leaf,
                index: at.index - 1,
            })
        } else {
            self.last_of(leaf.prev)
        };
        Near { at, below, above }
    }

    /// The range with the least start at or above `key`.
    pub(crate) fn lower_bound(&self, key: u64) -> Option<Pos> {
        if self.root == NIL {
            return None;
        }
        let at = self.seek(key);
        if at.index < self.leaves[at.leaf as usize].len {
            Some(at)
        } else {
            self.first_of(self.leaves[at.leaf as usize].next)
        }
    }

    /// The entry after `pos` in address order.
    pub(crate) fn next(&self, pos: Pos) -> Option<Pos> {
        let leaf = &self.leaves[pos.leaf as usize];
        if pos.index + 1 < leaf.len {
            Some(Pos {
                leaf: pos.leaf,
                index: pos.index + 1,
            })
        } else {
            self.first_of(leaf.next)
        }
    }

    /// Every entry as `(start, length, payload)`, in address order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64, &V)> + '_ {
        std::iter::successors(self.lower_bound(0), move |&p| self.next(p)).map(move |p| {
            let (k, s) = self.entry(p);
            (k, s, self.value(p))
        })
    }

    /// Adds the range `[key, key + size)` with payload `value`. `key` must not be a start in
    /// the tree already (the tree does not check that ranges are disjoint).
    pub(crate) fn insert(&mut self, key: u64, size: u64, value: V) {
        let at = self.near(key).at;
        self.insert_at(at, key, size, value);
    }

    /// Adds a range at `at`, the insertion point [`near`](Self::near) gave for its start.
    pub(crate) fn insert_at(&mut self, at: Pos, key: u64, size: u64, value: V) {
        self.len += 1;
        if self.root == NIL {
            let leaf = self.new_leaf(NIL, NIL, NIL);
            self.root = leaf;
            self.height = 0;
            let l = &mut self.leaves[leaf as usize];
            l.keys[0] = key;
            l.sizes[0] = size;
            l.values[0] = value;
            l.len = 1;
            return;
        }
        let (leaf, index) = (at.leaf, at.index);
        if self.leaves[leaf as usize].len == B {
            // Split: the upper half moves to a new leaf after this one.
            let next = self.leaves[leaf as usize].next;
            let parent = self.leaves[leaf as usize].parent;
            let right = self.new_leaf(parent, leaf, next);
            if next != NIL {
                self.leaves[next as usize].prev = right;
            }
            self.leaves[leaf as usize].next = right;
            let half = B / 2;
            for i in half..B {
                let (k, s) = {
                    let l = &self.leaves[leaf as usize];
                    (l.keys[i], l.sizes[i])
                };
                let v = std::mem::take(&mut self.leaves[leaf as usize].values[i]);
                let r = &mut self.leaves[right as usize];
                r.keys[i - half] = k;
                r.sizes[i - half] = s;
                r.values[i - half] = v;
            }
            self.leaves[leaf as usize].len = half;
            self.leaves[right as usize].len = B - half;
            let (target, index) = if index <= half {
                (leaf, index)
            } else {
                (right, index - half)
            };
            self.leaf_insert(target, index, key, size, value);
            let (min, max) = self.summary(right, 0);
            self.insert_child(parent, 0, leaf, right, max, min);
            self.refresh_up(leaf, 0);
            self.refresh_up(right, 0);
        } else {
            self.leaf_insert(leaf, index, key, size, value);
            self.fix_up(leaf, 0, size);
        }
    }

    /// Removes the entry at `pos` and returns its payload.
    pub(crate) fn remove(&mut self, pos: Pos) -> V {
        self.len -= 1;
        let leaf = pos.leaf;
        let removed = self.leaves[leaf as usize].sizes[pos.index];
        let value = {
            let l = &mut self.leaves[leaf as usize];
            let value = std::mem::take(&mut l.values[pos.index]);
            l.keys.copy_within(pos.index + 1..l.len, pos.index);
            l.sizes.copy_within(pos.index + 1..l.len, pos.index);
            l.values[pos.index..l.len].rotate_left(1);
            l.len -= 1;
            value
        };
        if self.leaves[leaf as usize].len > 0 {
            self.fix_up(leaf, removed, 0);
            return value;
        }
        // The leaf is empty: unlink it, and its ancestors that empty with it.
        let Leaf {
            prev, next, parent, ..
        } = self.leaves[leaf as usize];
        if prev != NIL {
            self.leaves[prev as usize].next = next;
        }
        if next != NIL {
            self.leaves[next as usize].prev = prev;
        }
        self.vacant_leaves.push(leaf);
        if parent == NIL {
            self.root = NIL;
            self.height = 0;
        } else {
            let slot = self.leaves[leaf as usize].slot as usize;
            self.remove_child(parent, slot);
        }
        value
    }

    /// Changes the start and length of the entry at `pos`; the start must stay between its
    /// neighbours'. Positions stay valid.
    pub(crate) fn set(&mut self, pos: Pos, key: u64, size: u64) {
        debug_assert!({
            let below = self.prev(pos).is_none_or(|p| self.entry(p).0 < key);
            let above = self.next(pos).is_none_or(|p| key < self.entry(p).0);
            below && above
        });
        let l = &mut self.leaves[pos.leaf as usize];
        let old = l.sizes[pos.index];
        l.keys[pos.index] = key;
        l.sizes[pos.index] = size;
        self.fix_up(pos.leaf, old, size);
    }

    // ---- internals ----

    fn new_leaf(&mut self, parent: u32, prev: u32, next: u32) -> u32 {
        let leaf = Leaf {
            len: 0,
            keys: [0; B],
            sizes: [0; B],
            values: std::array::from_fn(|_| V::default()),
            parent,
            slot: 0,
            prev,
            next,
        };
        place(&mut self.leaves, &mut self.vacant_leaves, leaf)
    }

    fn new_inner(&mut self, parent: u32) -> u32 {
        let inner = Inner {
            len: 0,
            keys: [0; B],
            maxes: [0; B],
            children: [NIL; B],
            parent,
            slot: 0,
        };
        place(&mut self.inners, &mut self.vacant_inners, inner)
    }

    fn leaf_max(&self, leaf: u32) -> u64 {
        let l = &self.leaves[leaf as usize];
        max_of(&l.sizes[..l.len])
    }

    /// The leaf and index where `key` is or would go.
    fn seek(&self, key: u64) -> Pos {
        let mut at = self.root;
        for _ in 0..self.height {
            let n = &self.inners[at as usize];
            // The last child whose smallest start is at most `key` (or the first).
            let i = count_at_most(&n.keys[1..n.len], key);
            at = n.children[i];
        }
        let leaf = &self.leaves[at as usize];
        let index = count_below(&leaf.keys[..leaf.len], key);
        Pos { leaf: at, index }
    }

    fn first_of(&self, leaf: u32) -> Option<Pos> {
        (leaf != NIL).then_some(Pos { leaf, index: 0 })
    }

    fn last_of(&self, leaf: u32) -> Option<Pos> {
        (leaf != NIL).then(|| Pos {
            leaf,
            index: self.leaves[leaf as usize].len - 1,
        })
    }

    /// The entry before `pos`.
    fn prev(&self, pos: Pos) -> Option<Pos> {
        if pos.index > 0 {
            Some(Pos {
                leaf: pos.leaf,
                index: pos.index - 1,
            })
        } else {
            self.last_of(self.leaves[pos.leaf as usize].prev)
        }
    }

    fn leaf_insert(&mut self, leaf: u32, index: usize, key: u64, size: u64, value: V) {
        let l = &mut self.leaves[leaf as usize];
        debug_assert!(l.len < B && index <= l.len);
        l.keys.copy_within(index..l.len, index + 1);
        l.sizes.copy_within(index..l.len, index + 1);
        l.values[index..=l.len].rotate_right(1);
        l.keys[index] = key;
        l.sizes[index] = size;
        l.values[index] = value;
        l.len += 1;
    }

    /// The largest length under node `id` at `height`.
    fn node_max(&self, id: u32, height: u32) -> u64 {
        if height == 0 {
            self.leaf_max(id)
        } else {
            let n = &self.inners[id as usize];
            max_of(&n.maxes[..n.len])
        }
    }

    /// The smallest start and largest length under node `id` at `height`.
    fn summary(&self, id: u32, height: u32) -> (u64, u64) {
        let min = if height == 0 {
            self.leaves[id as usize].keys[0]
        } else {
            self.inners[id as usize].keys[0]
        };
        (min, self.node_max(id, height))
    }

    /// The parent of node `id` at `height`, and its index among the parent's children.
    fn parent_slot(&self, id: u32, height: u32) -> (u32, usize) {
        let (parent, slot) = if height == 0 {
            let l = &self.leaves[id as usize];
            (l.parent, l.slot)
        } else {
            let n = &self.inners[id as usize];
            (n.parent, n.slot)
        };
        debug_assert!(
            parent == NIL || self.inners[parent as usize].children[slot as usize] == id,
            "stale slot of node {id}"
        );
        (parent, slot as usize)
    }

    /// Records `parent` and the index there of each child of `parent` (at `height`) from
    /// `from` on.
    fn reindex(&mut self, parent: u32, height: u32, from: usize) {
        for slot in from..self.inners[parent as usize].len {
            let child = self.inners[parent as usize].children[slot];
            if height == 0 {
                let l = &mut self.leaves[child as usize];
                l.parent = parent;
                l.slot = slot as u32;
            } else {
                let n = &mut self.inners[child as usize];
                n.parent = parent;
                n.slot = slot as u32;
            }
        }
    }

    /// Brings the summaries above `leaf` up to date after one of its entries changed in place
    /// from length `old` to `new` (0 for an entry added or removed), stopping where nothing
    /// changes (every summary above was exact before). A node's largest length is rescanned
    /// only when the entry that held it shrank.
    fn fix_up(&mut self, leaf: u32, mut old: u64, mut new: u64) {
        let (mut node, mut height) = (leaf, 0);
        loop {
            let (parent, slot) = self.parent_slot(node, height);
            if parent == NIL {
                return;
            }
            let current = self.inners[parent as usize].maxes[slot];
            let max = if new >= current {
                new
            } else if old == current {
                self.node_max(node, height)
            } else {
                current
            };
            let min = if height == 0 {
                self.leaves[node as usize].keys[0]
            } else {
                self.inners[node as usize].keys[0]
            };
            let p = &mut self.inners[parent as usize];
            if p.keys[slot] == min && current == max {
                return;
            }
            p.keys[slot] = min;
            p.maxes[slot] = max;
            (old, new) = (current, max);
            node = parent;
            height += 1;
        }
    }

    /// Recomputes every summary above node `id` at `height`, all the way up (after a
    /// structural change).
    fn refresh_up(&mut self, mut id: u32, mut height: u32) {
        loop {
            let (parent, slot) = self.parent_slot(id, height);
            if parent == NIL {
                return;
            }
            let (min, max) = self.summary(id, height);
            let p = &mut self.inners[parent as usize];
            p.keys[slot] = min;
            p.maxes[slot] = max;
            id = parent;
            height += 1;
        }
    }

    /// Adds `right` after `left` (both at `height`) among the children of `parent`, splitting
    /// nodes up the tree as needed; a new root when `parent` is [`NIL`]. The caller refreshes
    /// the summaries above `left` and `right`.
    fn insert_child(
        &mut self,
        parent: u32,
        height: u32,
        left: u32,
        right: u32,
        max: u64,
        min: u64,
    ) {
        if parent == NIL {
            let root = self.new_inner(NIL);
            let (lmin, lmax) = self.summary(left, height);
            let n = &mut self.inners[root as usize];
            n.len = 2;
            n.children[..2].copy_from_slice(&[left, right]);
            n.keys[..2].copy_from_slice(&[lmin, min]);
            n.maxes[..2].copy_from_slice(&[lmax, max]);
            self.reindex(root, height, 0);
            self.root = root;
            self.height = height + 1;
            return;
        }
        let i = self.parent_slot(left, height).1 + 1;
        let target = if self.inners[parent as usize].len < B {
            parent
        } else {
            // Split `parent`: its upper half moves to a new node after it.
            let grand = self.inners[parent as usize].parent;
            let sibling = self.new_inner(grand);
            let half = B / 2;
            {
                let (p, s) = if parent < sibling {
                    let (a, b) = self.inners.split_at_mut(sibling as usize);
                    (&mut a[parent as usize], &mut b[0])
                } else {
                    let (a, b) = self.inners.split_at_mut(parent as usize);
                    (&mut b[0], &mut a[sibling as usize])
                };
                s.children[..B - half].copy_from_slice(&p.children[half..]);
                s.keys[..B - half].copy_from_slice(&p.keys[half..]);
                s.maxes[..B - half].copy_from_slice(&p.maxes[half..]);
                p.len = half;
                s.len = B - half;
            }
            self.reindex(sibling, height, 0);
            let (smin, smax) = self.summary(sibling, height + 1);
            self.insert_child(grand, height + 1, parent, sibling, smax, smin);
            if i <= half {
                parent
            } else {
                sibling
            }
        };
        let i = if target == parent { i } else { i - B / 2 };
        let n = &mut self.inners[target as usize];
        n.children.copy_within(i..n.len, i + 1);
        n.keys.copy_within(i..n.len, i + 1);
        n.maxes.copy_within(i..n.len, i + 1);
        n.children[i] = right;
        n.keys[i] = min;
        n.maxes[i] = max;
        n.len += 1;
        self.reindex(target, height, i);
        if target != parent {
            // `parent` lost its upper half.
            self.refresh_up(parent, height + 1);
        }
        self.refresh_up(target, height + 1);
    }

    /// Removes the (now empty) child at `slot` of inner node `parent`, removing `parent` too
    /// when it empties, and collapses a root left with one child.
    fn remove_child(&mut self, parent: u32, slot: usize) {
        let height = self.height_of(parent);
        let n = &mut self.inners[parent as usize];
        n.children.copy_within(slot + 1..n.len, slot);
        n.keys.copy_within(slot + 1..n.len, slot);
        n.maxes.copy_within(slot + 1..n.len, slot);
        n.len -= 1;
        if n.len == 0 {
            let grand = n.parent;
            let grand_slot = n.slot as usize;
            self.vacant_inners.push(parent);
            if grand == NIL {
                self.root = NIL;
                self.height = 0;
            } else {
                self.remove_child(grand, grand_slot);
            }
            return;
        }
        self.reindex(parent, height - 1, slot);
        self.refresh_up(parent, height);
        // Collapse a root with a single child.
        while self.height > 0 && self.inners[self.root as usize].len == 1 {
            let old = self.root;
            let only = self.inners[old as usize].children[0];
            self.vacant_inners.push(old);
            self.height -= 1;
            if self.height == 0 {
                self.leaves[only as usize].parent = NIL;
            } else {
                self.inners[only as usize].parent = NIL;
            }
            self.root = only;
        }
    }

    /// The height of inner node `id` (leaves are at 0).
    fn height_of(&self, id: u32) -> u32 {
        let mut depth = 0;
        let mut at = self.inners[id as usize].parent;
        while at != NIL {
            depth += 1;
            at = self.inners[at as usize].parent;
        }
        self.height - depth
    }

    /// Checks every invariant exhaustively; panics with a description of the first broken one.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        if self.root == NIL {
            assert_eq!(self.len, 0, "len of an empty tree");
            return;
        }
        let mut count = 0;
        let mut leaves = Vec::new();
        self.check_node(self.root, self.height, NIL, &mut count, &mut leaves);
        assert_eq!(count, self.len, "len");
        // The leaf list links the leaves in order.
        for (i, &l) in leaves.iter().enumerate() {
            let leaf = &self.leaves[l as usize];
            let prev = if i == 0 { NIL } else { leaves[i - 1] };
            let next = leaves.get(i + 1).copied().unwrap_or(NIL);
            assert_eq!((leaf.prev, leaf.next), (prev, next), "links of leaf {l}");
            assert!(leaf.len > 0 || self.len == 0, "empty leaf {l}");
        }
        let keys: Vec<u64> = self.iter().map(|(k, _, _)| k).collect();
        assert_eq!(keys.len(), self.len, "in-order walk");
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "keys out of order");
        if self.height > 0 {
            assert!(
                self.inners[self.root as usize].len > 1,
                "root with one child"
            );
        }
    }

    /// Checks the subtree at `id`; returns its smallest start and largest length.
    #[cfg(test)]
    fn check_node(
        &self,
        id: u32,
        height: u32,
        parent: u32,
        count: &mut usize,
        leaves: &mut Vec<u32>,
    ) -> (u64, u64) {
        if height == 0 {
            let l = &self.leaves[id as usize];
            assert_eq!(l.parent, parent, "parent of leaf {id}");
            if parent != NIL {
                assert_eq!(
                    self.inners[parent as usize].children[l.slot as usize], id,
                    "slot"
                );
            }
            assert!(l.len > 0 && l.len <= B, "leaf {id} has {} entries", l.len);
            assert!(
                l.keys[..l.len].windows(2).all(|w| w[0] < w[1]),
                "leaf {id} order"
            );
            *count += l.len;
            leaves.push(id);
            return (l.keys[0], self.leaf_max(id));
        }
        let n = &self.inners[id as usize];
        assert_eq!(n.parent, parent, "parent of inner node {id}");
        if parent != NIL {
            assert_eq!(
                self.inners[parent as usize].children[n.slot as usize], id,
                "slot"
            );
        }
        assert!(
            n.len > 0 && n.len <= B,
            "inner node {id} has {} children",
            n.len
        );
        let mut max = 0;
        for i in 0..n.len {
            let (kmin, kmax) = self.check_node(n.children[i], height - 1, id, count, leaves);
            assert_eq!(n.keys[i], kmin, "smallest start under child {i} of {id}");
            assert_eq!(n.maxes[i], kmax, "largest length under child {i} of {id}");
            max = max.max(kmax);
        }
        (n.keys[0], max)
    }
}

/// Puts `node` in a vacant slot of `slab`, or a new one; returns its id.
fn place<T>(slab: &mut Vec<T>, vacant: &mut Vec<u32>, node: T) -> u32 {
    match vacant.pop() {
        Some(id) => {
            slab[id as usize] = node;
            id
        }
        None => {
            slab.push(node);
            u32::try_from(slab.len() - 1).expect("too many tree nodes")
        }
    }
}

// Branch-free scans over the entries of a node (the loops have no early exit to mispredict).

/// The index of the first value at least `size`.
fn first_at_least(values: &[u64], size: u64) -> Option<usize> {
    let mut mask = 0u32;
    for (i, &v) in values.iter().enumerate() {
        mask |= u32::from(v >= size) << i;
    }
    (mask != 0).then(|| mask.trailing_zeros() as usize)
}

/// How many of `keys` are at most `key`.
fn count_at_most(keys: &[u64], key: u64) -> usize {
    keys.iter().map(|&k| usize::from(k <= key)).sum()
}

/// How many of `keys` are below `key`.
fn count_below(keys: &[u64], key: u64) -> usize {
    keys.iter().map(|&k| usize::from(k < key)).sum()
}

fn max_of(values: &[u64]) -> u64 {
    values.iter().fold(0, |m, &v| m.max(v))
}
