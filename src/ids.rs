//! The ground floor: plain names for devices, streams and backends, which every layer above
//! (errors included) uses and none of which needs anything of the crate.

use std::fmt;

/// Which backend a device runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    /// CPU emulation: device memory is host memory, streams are worker threads.
    Host,
    /// An NVIDIA GPU through the CUDA driver API.
    Cuda,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
        })
    }
}

/// Names a device: its backend and ordinal (`cuda:0`, `host:0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    /// The backend the device runs on.
    pub backend: BackendKind,
    /// The device's ordinal within its backend. Host devices are numbered in creation order;
    /// `host:0` is the shared one that [`Device::host`](crate::Device::host) returns.
    pub ordinal: u32,
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.backend, self.ordinal)
    }
}

/// A process-unique stream number, stable for the stream's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream#{}", self.0)
    }
}
