//! The vocabulary the coordinator and its backends share: the commands and answers that are no
//! kernel's own (a kernel's are in `kernel/`). It sits below both, so a backend never imports
//! its owner.

use std::time::Duration;

use uuid::Uuid;

use crate::identity::Identity;
use crate::policy::bulkhead::kernel::{LeaseAction, LeaseReply, LeaseStep};

/// One lease command: `action` on `token`'s lease in `identity`'s lease set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseCommand<'a> {
    pub(crate) identity: &'a Identity,
    pub(crate) action: LeaseAction,
    pub(crate) token: Uuid,
    pub(crate) ttl: Duration,
    pub(crate) limit: u32,
}

impl LeaseCommand<'_> {
    /// The ttl as the lease set keeps deadlines: whole milliseconds.
    pub(crate) fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// The command as the lease kernel takes it. It knows no live fencing token: the Redis
    /// backend sends the one it knows when the command goes out, and nothing is ever lost in
    /// memory.
    pub(crate) fn step(&self) -> LeaseStep {
        LeaseStep {
            action: self.action,
            token: self.token.as_u128(),
            ttl: self.ttl_ms(),
            limit: self.limit,
            known: 0,
        }
    }
}

/// A lease command's answer, and when the command was sent: the server set any deadline it
/// granted after that. An acquire may wait in its identity's lane before its batch is sent, so
/// this is later than when its caller asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseAnswer {
    pub(crate) reply: LeaseReply,
    pub(crate) sent: tokio::time::Instant,
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
