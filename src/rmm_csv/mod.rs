//! RMM's allocation-log CSV format, both ways: the writer the
//! [`LoggingAdaptor`](crate::LoggingAdaptor) formats its lines with, byte for byte as RMM's
//! `logging_resource_adaptor` writes them, and the reader the [`replay`](crate::replay) module
//! parses logs with (RMM's and ours). What one side writes is what the other reads: the header,
//! the action words, the pointer spellings.

mod error;
mod fields;
mod reader;
mod writer;

pub use error::{ReplayError, ReplayResult};
pub use fields::{Action, LOG_HEADER};
pub use reader::{parse_log, parse_log_file, parse_log_str, Event, EventReader};
pub(crate) use writer::{write_header, LineFormatter, Record, MAX_LINE};
#[cfg(test)]
pub(crate) use writer::{CPointer, StreamHandle, TimeOfDay};
