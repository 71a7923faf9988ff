//! The embedded backend: the same semantics as the Lua scripts, in process memory, on tokio's
//! clock (so tests can pause and advance time).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::time::Instant;
use uuid::Uuid;

use super::{LeaseAction, LeaseCommand, LeaseReply};
use crate::error::FailureKind;
use crate::Error;
use crate::identity::KeyBase;
use crate::sync::lock;

#[derive(Debug, Default)]
pub(super) struct MemoryBackend {
    /// Live leases per lease set: token and deadline. A set is removed once empty, as the Redis
    /// key expires at its latest deadline.
    leases: Mutex<HashMap<KeyBase, Vec<(Uuid, Instant)>>>,
    closed: AtomicBool,
}

impl MemoryBackend {
    fn check_open(&self) -> Result<(), Error> {
        if self.closed.load(Ordering::Acquire) {
            Err(Error::unavailable(FailureKind::ShutDown, "coordinator shut down"))
        } else {
            Ok(())
        }
    }

    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub(super) fn lease(&self, command: LeaseCommand<'_>) -> Result<LeaseReply, Error> {
        self.check_open()?;
        let now = Instant::now();
        let mut sets = lock(&self.leases);
        let set = sets.entry(command.key.clone()).or_default();
        set.retain(|&(_, deadline)| deadline > now);
        let held = set.iter().position(|&(token, _)| token == command.token);
        let occupancy = |set: &Vec<_>| u32::try_from(set.len()).unwrap_or(u32::MAX);
        let reply = match (command.action, held) {
            (LeaseAction::Renew, Some(index)) => {
                set[index].1 = now + command.ttl;
                LeaseReply { allowed: true, occupancy: occupancy(set) }
            }
            (LeaseAction::Acquire, Some(_)) => LeaseReply { allowed: true, occupancy: occupancy(set) },
            (LeaseAction::Renew, None) => LeaseReply { allowed: false, occupancy: occupancy(set) },
            (LeaseAction::Acquire, None) if occupancy(set) >= command.limit => {
                LeaseReply { allowed: false, occupancy: occupancy(set) }
            }
            (LeaseAction::Acquire, None) => {
                set.push((command.token, now + command.ttl));
                LeaseReply { allowed: true, occupancy: occupancy(set) }
            }
        };
        if set.is_empty() {
            sets.remove(command.key);
        }
        Ok(reply)
    }

    /// Removes `token`'s lease; `true` if it was live.
    pub(super) fn release(&self, key: &KeyBase, token: Uuid) -> Result<bool, Error> {
        self.check_open()?;
        let now = Instant::now();
        let mut sets = lock(&self.leases);
        let Some(set) = sets.get_mut(key) else {
            return Ok(false);
        };
        let removed = set
            .iter()
            .any(|&(held, deadline)| held == token && deadline > now);
        set.retain(|&(held, deadline)| held != token && deadline > now);
        if set.is_empty() {
            sets.remove(key);
        }
        Ok(removed)
    }
}
