//! Settings written the same way everywhere: a builder's `Option` field set by a method of
//! the same use, `fn name(mut self, value) -> Self`.

/// Writes, for each `$(#[$attr])* fn $name($arg: $ty) => $field;`, the builder method
/// `pub fn $name(mut self, $arg: $ty) -> Self` that sets `self.$field = Some($arg)`.
macro_rules! option_setters {
    ($($(#[$attr:meta])* fn $name:ident($arg:ident: $ty:ty) => $field:ident;)*) => {$(
        $(#[$attr])*
        pub fn $name(mut self, $arg: $ty) -> Self {
            self.$field = Some($arg);
            self
        }
    )*};
}

pub(crate) use option_setters;
