//! The identity registry: which identities the namespace's processes use, by name (keys hold
//! only hashes), with the values each uses them with — for `caracal status` and `config get`,
//! and to notice drift (processes using one identity with different values).
//!
//! Each process keeps, per identity and call site, the values it last used; every
//! [`REPORT_EVERY`](bounds::REPORT_EVERY) it reports those used since its previous report in
//! one command, and reports at once an identity it starts using or whose values change. The
//! coordinator keeps each identity until its ttl (the life of the state it describes, at least
//! a few report periods) passes without a report, and at most [`MAX_IDENTITIES`]. A report
//! answers whether another reporter used other values within [`DRIFT_WINDOW`]; a change of
//! that answer is a `config.drift` event.

mod bounds;
mod read;
mod report;
mod status;
mod store;

pub(crate) use self::bounds::{
    DRIFT_WINDOW, MAX_IDENTITIES, MOST_PROCESSES_PER_IDENTITY, REPORT_EVERY,
};
pub use self::read::{Process, Rates};
pub(crate) use self::read::{Registered, Reported, uses_of};
pub(crate) use self::report::{Report, Reporting, describe};
pub(crate) use self::status::{MemoryRead, Snapshot, StatusRead, found};
pub(in crate::coordinator) use self::store::Store;

#[cfg(test)]
mod tests;
