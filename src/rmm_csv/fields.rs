//! The format's words, which the writer writes and the reader reads: the header and the
//! actions.

use std::fmt;

/// The header line of RMM's allocation log, which [`LoggingAdaptor`](crate::LoggingAdaptor)
/// writes first and the [`replay`](crate::replay) parser reads.
pub const LOG_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// The `Action` of a successful allocation.
const ALLOCATE: &str = "allocate";
/// The `Action` of a failed allocation.
pub(super) const ALLOCATE_FAILURE: &str = "allocate failure";
/// The `Action` of a free.
const FREE: &str = "free";

/// What a log line records.
///
/// # Examples
///
/// ```
/// use streamalloc::replay::Action;
///
/// assert_eq!("allocate failure".parse::<Action>(), Ok(Action::AllocateFailure));
/// assert_eq!(Action::Free.to_string(), "free");
/// assert!("realloc".parse::<Action>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `allocate`: an allocation that succeeded.
    Allocate,
    /// `allocate failure`: an allocation that failed (its pointer is `(nil)`).
    AllocateFailure,
    /// `free`: a free.
    Free,
}

impl Action {
    /// The action as the log spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allocate => ALLOCATE,
            Action::AllocateFailure => ALLOCATE_FAILURE,
            Action::Free => FREE,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Action {
    type Err = String;

    /// Parses `allocate`, `allocate failure` or `free`; the error says what was found.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            ALLOCATE => Ok(Action::Allocate),
            ALLOCATE_FAILURE => Ok(Action::AllocateFailure),
            FREE => Ok(Action::Free),
            other => Err(format!(
                "Action: `{}` is none of `allocate`, `allocate failure`, `free`",
                excerpt(other)
            )),
        }
    }
}

/// At most this many characters of a bad field go into an error message.
const EXCERPT: usize = 40;

/// `s`, cut short for an error message.
pub(super) fn excerpt(s: &str) -> String {
    match s.char_indices().nth(EXCERPT) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}
