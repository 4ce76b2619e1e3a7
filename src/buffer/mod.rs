//! Owning device memory with stream-ordered drop and cross-stream use tracking.
//! (placeholder: being written)

/// placeholder
#[derive(Debug)]
pub struct DeviceBuffer;
