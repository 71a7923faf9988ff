//! What a process reports: its identities in use, and itself.

use super::bounds::REPORT_EVERY;
use crate::coordinator::feed;
use crate::identity::{Identity, KeyBase};

#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub(crate) key: KeyBase,
    /// JSON `[kind, name, operation, scope]`.
    pub(crate) description: String,
    pub(crate) values: String,
    pub(crate) sources: String,
    /// This process and call site.
    pub(crate) reporter: String,
    pub(crate) ttl_ms: u64,
    /// The version of the fleet's overrides the values were resolved under: reporters under
    /// different versions are in the middle of applying a fleet-wide change, not drifting.
    pub(crate) fleet: u64,
    /// What the process adds of its own (JSON, see [`Reported`]): its decisions per second
    /// since its last report, and the keys whose fleet override it ignores.
    pub(crate) extra: String,
}

/// This process as it reports itself with its uses: its id, its record (JSON: host, pid,
/// version, identities) and how long it stays listed without another report.
#[derive(Debug, Clone)]
pub(crate) struct Reporting {
    pub(crate) id: &'static str,
    pub(crate) record: String,
    pub(crate) ttl_ms: u64,
}

impl Reporting {
    /// This process, using `identities` identities.
    pub(in crate::coordinator) fn now(identities: usize) -> Self {
        let record = serde_json::json!({
            "host": host(),
            "pid": std::process::id(),
            "version": env!("CARGO_PKG_VERSION"),
            "identities": identities,
        });
        Reporting {
            id: feed::process_id(),
            record: record.to_string(),
            ttl_ms: u64::try_from((REPORT_EVERY * 3).as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// The machine's name, as the kernel has it (`unknown` where it cannot be read).
fn host() -> &'static str {
    static HOST: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|host| host.trim().to_owned())
            .filter(|host| !host.is_empty())
            .unwrap_or_else(|| "unknown".to_owned())
    });
    &HOST
}

/// JSON `[kind, name, operation, scope]`: how the registry names an identity.
pub(crate) fn describe(identity: &Identity) -> String {
    let parts = [
        identity.kind.as_str(),
        &identity.name,
        &identity.operation,
        identity.scope.as_str(),
    ];
    serde_json::to_string(&parts).unwrap_or_default()
}
