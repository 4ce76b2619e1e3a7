pub(crate) mod core;
