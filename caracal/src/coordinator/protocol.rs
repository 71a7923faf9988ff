//! The vocabulary the coordinator and its backends share: the commands and answers that are no
//! kernel's own (a kernel's are in `kernel/`). It sits below both, so a backend never imports
//! its owner.

use crate::identity::Identity;
use crate::policy::breaker::kernel::Settings;

/// A breaker identity and the settings its commands carry.
#[derive(Debug, Clone)]
pub(crate) struct BreakerTarget {
    pub(crate) identity: Identity,
    pub(crate) settings: Settings,
}

/// The fleet's overrides as read.
#[derive(Debug, Clone)]
pub(crate) struct FleetOverrides {
    pub(crate) version: u64,
    /// Unless the caller held that version already: the overrides (`"<kind>.<name>.<key>"`,
    /// value), and the operator record of the change that made the version, if there is one
    /// (see `coordinator::operators`).
    pub(crate) changed: Option<(StoredOverrides, Option<String>)>,
}

/// Overrides as stored: `"<kind>.<name>.<key>"`, value.
pub(crate) type StoredOverrides = Vec<(String, String)>;
