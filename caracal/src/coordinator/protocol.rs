//! The vocabulary the coordinator and its backends share that is no kernel's own (a kernel's
//! commands and replies are in its kind's folder): the fleet's overrides as stored and read. It
//! sits below both, so a backend never imports its owner.

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
