//! Merging fence lists: what both cores do when memory freed behind fences joins memory
//! that already carries some.

/// Adds each of `from` to `into` unless it is there already.
pub(super) fn merge_fences<F: PartialEq>(into: &mut Vec<F>, from: impl IntoIterator<Item = F>) {
    for f in from {
        if !into.contains(&f) {
            into.push(f);
        }
    }
}
