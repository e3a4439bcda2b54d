//! What ends a run early. A leaf: every module that can fail names it, and it names none.

/// Whatever ends a run early, as a message.
pub(crate) type Failure = Box<dyn std::error::Error + Send + Sync>;
