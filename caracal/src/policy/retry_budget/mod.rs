//! `#[retry_budget]`: a fleet-wide retry budget.
//!
//! Stacked outside `#[retry]`: every call whose first attempt reaches the downstream deposits
//! (one refused by a policy below, as a full bulkhead, a rate limit or an open breaker, does
//! not: it costs the downstream nothing), every further attempt withdraws, across every
//! process sharing the identity. A window of `window` allows
//! `percent`% of its deposits plus `min_per_second` for each of its seconds in withdrawals; a
//! retry it does not allow is not made, and the call ends with the last attempt's result
//! (`retry.budget_exhausted` says so, once, then summarised).
//!
//! **No round trip.** A process decides from its view of the fleet's window: the totals the
//! coordinator last answered plus its own counts since (see `view.rs`). Counts go out in
//! batches, one in flight per identity, [`REFRESH`](view::REFRESH) (100 ms) after the first
//! count a batch holds: at most ten per second per identity and process, whatever the traffic.
//!
//! **The overshoot bound.** A view misses what the other processes counted since its last
//! answer. A count made by process *j* reaches the server within `R + 2·RTT` (it waits for
//! the batch timer `R`, and at most for the batch in flight); process *i* learns it with its
//! next answer, within another `R + RTT`. So a view is at most `S = 2R + 3·RTT` behind the
//! fleet, and at each of its decisions it misses at most the withdrawals the others made in
//! the last `S`, and counts at most the deposits that left the window in the last `S`. Within
//! any window the fleet's retries are therefore at most
//!
//! ```text
//! percent% × deposits + min_per_second × window  +  S × Σ_j (r_j + percent% × d_j)
//! ```
//!
//! where `r_j` is the rate at which process *j* asks for retries and `d_j` its rate of first
//! attempts (both at most its call rate). Own counts are exact: a single process never
//! overshoots. With R = 100 ms and a loopback RTT, S ≈ 0.2 s.
//!
//! The window slides by tenths: it holds between nine and ten tenths of the latest `window`.
//! `local = true` keeps the window in the process (the same kernel).
//!
//! **The outage bound.** When the coordinator cannot be reached the batches fail
//! (`retry_budget.degraded`) and each process decides on its local share (see `view.rs`):
//! `percent`% of its own first attempts in the window plus its part of the floor, its part of
//! the fleet's first attempts as it last learnt them. The shares add up to the budget of the
//! fleet's own first attempts, so in any window that an outage overlaps the fleet's retries
//! are at most the budget plus the overshoot above (the view that led into the outage), plus
//! how far each process's part of the first attempts moved since it last learnt it, times the
//! floor. A process that never learnt the fleet's window holds the whole floor. The retries of
//! failed batches reach the fleet's window when the link returns; their first attempts do not
//! (so a window after an outage is tighter, never looser).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use caracal_spec::retry_budget as spec;

use crate::clock::Clock;
use crate::config::Setting;
use crate::config::overrides::Values;
use crate::coordinator::registry::{MemoryRead, Registered, Snapshot, StatusRead, found};
use crate::coordinator::{self, Coordinator, WeakCoordinator};
use crate::ctx::{CallCtx, Gate, Gated};
use crate::error::Error;
use crate::identity::{Identity, PolicyKind, Scope};
use crate::kernel::{Kernel, Now, Seen};
use crate::labels::At;
use crate::policy::descriptor::{Decisions, Descriptor, Field, StatusValue, Unit};
use crate::policy::registry::{self, Registry};
use crate::policy::retry_budget::kernel::{self as window, Allowance, Record, Slide, Totals};
use crate::sync::lock;

#[cfg(test)]
pub(super) mod differential;
mod events;
pub(crate) mod kernel;
#[cfg(feature = "tower")]
mod tower;
mod view;

/// The settings of one `#[retry_budget]` call site.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct RetryBudgetConfig {
    /// The policy name.
    pub name: &'static str,
    /// The operation name.
    pub operation: &'static str,
    /// Retries allowed per 100 first attempts.
    pub percent: u32,
    /// Retries allowed per second whatever the traffic.
    pub min_per_second: u32,
    /// How far back deposits and withdrawals count.
    pub window: Duration,
    /// Per-process only.
    pub local: bool,
    /// Shadow mode: a retry over the budget is made, not withdrawn, and counted.
    pub shadow: bool,
}

/// The values of a budget that configuration may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BudgetValues {
    percent: u32,
    min_per_second: u32,
    window: Duration,
    shadow: bool,
}

impl BudgetValues {
    fn allowance(&self) -> Allowance {
        Allowance {
            percent: self.percent,
            min_per_second: self.min_per_second,
            window_ms: u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl Values for BudgetValues {
    const KIND: PolicyKind = PolicyKind::RetryBudget;

    fn get(&self, key: &str) -> Option<Setting> {
        match key {
            "percent" => Some(Setting::Count(self.percent)),
            "min_per_second" => Some(Setting::Count(self.min_per_second)),
            "window" => Some(Setting::Duration(self.window)),
            "shadow" => Some(Setting::Flag(self.shadow)),
            _ => None,
        }
    }

    fn set(&mut self, key: &str, setting: Setting) {
        match (key, setting) {
            ("percent", Setting::Count(percent)) => self.percent = percent,
            ("min_per_second", Setting::Count(min)) => self.min_per_second = min,
            ("window", Setting::Duration(window)) => self.window = window,
            ("shadow", Setting::Flag(shadow)) => self.shadow = shadow,
            _ => {}
        }
    }

    fn lifetime(&self) -> Duration {
        self.window
    }
}

/// The retry budget kind: its status is the window's totals and what they allow now.
pub(crate) const DESCRIPTOR: Descriptor = Descriptor {
    kind: PolicyKind::RetryBudget,
    fields: &[
        // Retries the window allows now, fleet-wide.
        Field::new("allowed", Unit::Count),
        Field::new("deposits", Unit::Count),
        Field::new("withdrawals", Unit::Count),
        Field::new("percent", Unit::Count),
    ],
    table: [
        "{allowed} retries left",
        "{withdrawals} retries for {deposits} calls[, {percent}%]",
    ],
    read: Some(StatusRead {
        script: &window::STATUS,
        keys: &["window"],
        figures: 2,
        memory: MemoryRead {
            states: &[std::any::TypeId::of::<window::Window>],
            figures: stored_figures,
        },
    }),
    status,
    events: &["retry_budget.degraded", "retry_budget.would_reject"],
    decisions: Decisions {
        admitted: &["within_budget"],
        rejected: &["budget_exhausted"],
        degraded: &["stale_view"],
    },
};

/// What the status script answers, from a window in memory.
fn stored_figures(stored: &[Option<&dyn std::any::Any>], _: u64) -> Vec<i64> {
    let window = found::<window::Window>(stored, 0);
    window::stored_totals(window)
        .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
        .to_vec()
}

fn status(reported: &Registered, snapshot: &Snapshot) -> Result<Vec<StatusValue>, Error> {
    let [deposits, withdrawals] = snapshot.figures()?;
    let count = |n: i64| u64::try_from(n).map_err(|_| snapshot.malformed(n));
    let totals = Totals {
        deposits: count(deposits)?,
        withdrawals: count(withdrawals)?,
    };
    let percent = reported.parsed::<u32>("percent");
    let allowed = percent.zip(reported.parsed::<u32>("min_per_second")).zip(
        reported
            .value("window")
            .and_then(|window| humantime::parse_duration(window).ok()),
    );
    let allowed = allowed.map(|((percent, min_per_second), window)| {
        let values = BudgetValues {
            percent,
            min_per_second,
            window,
            // The allowance does not depend on it.
            shadow: false,
        };
        values
            .allowance()
            .of(totals.deposits)
            .saturating_sub(totals.withdrawals)
    });
    Ok(vec![
        StatusValue::count(allowed),
        StatusValue::Count(totals.deposits),
        StatusValue::Count(totals.withdrawals),
        StatusValue::count(percent),
    ])
}

/// One identity's window kept in this process (`local = true`), on its own clock.
#[derive(Debug)]
pub(crate) struct Cell {
    clock: Clock,
    window: Mutex<window::Window>,
}

impl Cell {
    fn new() -> Self {
        Cell {
            clock: Clock::start(),
            window: Mutex::default(),
        }
    }

    /// A window whose buckets have all left no longer matters.
    fn idle(&self) -> bool {
        let ms = self.clock.ms();
        crate::kernel::State::forgettable(
            &*lock(&self.window),
            Now {
                ms,
                ns: 0,
                order: 0,
            },
        )
    }

    /// Counts a deposit, or a withdrawal if `allowance` allows it: whether it was counted,
    /// and the totals before.
    fn count(&self, values: &BudgetValues, withdrawal: bool) -> (bool, Totals) {
        let ms = self.clock.ms();
        let now = Now {
            ms,
            ns: self.clock.ns(),
            order: 0,
        };
        let window_ms = values.allowance().window_ms;
        let mut state = lock(&self.window);
        let seen = Slide::step(
            &mut state,
            &Record::new(Totals::default(), window_ms),
            now,
            &mut Seen::default(),
        );
        let allowed = !withdrawal || window::allows(seen, &values.allowance());
        if allowed {
            let counts = Totals {
                deposits: u64::from(!withdrawal),
                withdrawals: u64::from(withdrawal),
            };
            Slide::step(
                &mut state,
                &Record::new(counts, window_ms),
                now,
                &mut Seen::default(),
            );
        }
        (allowed, seen)
    }
}

/// Every local window of the process.
static CELLS: Registry<Cell> = Registry::new(Cell::idle);

/// One `#[retry_budget]` call site (or tower budget): its settings and its cached windows.
#[doc(hidden)]
#[derive(Debug)]
pub struct RetryBudgetSite {
    config: RetryBudgetConfig,
    local: registry::SiteCache<Cell>,
    /// The fleet's budget at the global scope under the first coordinator the site met: every
    /// call there after the first reuses it, and its retries ask it with no allocation.
    fleet: OnceLock<Fleet>,
    /// Whether the site is listed among the process's budgets ([`named`]).
    listed: AtomicBool,
    /// Whether it stands in for a budget of the fleet's ([`adopted`]).
    adopted: bool,
}

/// The budgets this process has used, by name: what a `#[hedge(budget = "name")]` draws
/// from when one is here. The first site of a name stands for it.
static NAMED: Mutex<Vec<&'static RetryBudgetSite>> = Mutex::new(Vec::new());

/// The budget named `name` this process has used, if any.
pub(crate) fn named(name: &str) -> Option<&'static RetryBudgetSite> {
    lock(&NAMED)
        .iter()
        .copied()
        .find(|site| site.config.name == name)
}

/// A budget site for `#[hedge]`s naming a budget used elsewhere in the fleet, with the values
/// and operation `reported` there (the attribute's defaults for any missing or out of its
/// bounds), kept for the program's life as an attribute's site is. It is not listed among
/// the process's budgets ([`named`]): a `#[retry_budget]` of the name used later stands for
/// the name, not this stand-in.
pub(crate) fn adopted(name: &str, reported: Option<&Registered>) -> &'static RetryBudgetSite {
    let name = crate::identity::intern(name);
    let value = |key: &caracal_spec::Key| {
        let caracal_spec::Type::Integer { min, max } = key.ty else {
            unreachable!("an integer key")
        };
        reported
            .and_then(|site| site.parsed::<u32>(key.name))
            .filter(|value| (min..=max).contains(value))
    };
    let caracal_spec::Type::Duration { min, max } = spec::WINDOW.ty else {
        unreachable!("a duration key")
    };
    let window = reported
        .and_then(|site| site.value(spec::WINDOW.name))
        .and_then(|window| humantime::parse_duration(window).ok())
        .filter(|window| (min..=max).contains(window));
    let operation = reported.map_or(name, |site| crate::identity::intern(&site.operation));
    Box::leak(Box::new(RetryBudgetSite {
        adopted: true,
        listed: AtomicBool::new(true),
        ..RetryBudgetSite::new(RetryBudgetConfig {
            name,
            operation,
            percent: value(&spec::PERCENT).unwrap_or(spec::PERCENT.default.integer()),
            min_per_second: value(&spec::MIN_PER_SECOND)
                .unwrap_or(spec::MIN_PER_SECOND.default.integer()),
            window: window.unwrap_or(spec::WINDOW.default.duration()),
            local: false,
            shadow: spec::SHADOW.default.flag(),
        })
    }))
}

impl RetryBudgetSite {
    /// A call site with these settings.
    pub const fn new(config: RetryBudgetConfig) -> Self {
        RetryBudgetSite {
            config,
            local: registry::SiteCache::new(),
            fleet: OnceLock::new(),
            listed: AtomicBool::new(false),
            adopted: false,
        }
    }

    /// Whether it stands in for a budget of the fleet's ([`adopted`]), which a budget of the
    /// name this process uses supersedes.
    pub(crate) fn is_adopted(&self) -> bool {
        self.adopted
    }

    /// Lists the site among the process's budgets, once.
    fn list(&'static self) {
        if !self.listed.load(Ordering::Relaxed) && !self.listed.swap(true, Ordering::Relaxed) {
            lock(&NAMED).push(self);
        }
    }

    fn at<'a>(&self, scope: &'a Scope) -> At<'a> {
        At {
            policy: DESCRIPTOR.kind.as_str(),
            name: self.config.name,
            operation: self.config.operation,
            scope: scope.as_str(),
            coordination: if self.config.local {
                "local"
            } else {
                "distributed"
            },
            shadow: false,
        }
    }

    /// The attribute's values.
    fn values(&self) -> BudgetValues {
        BudgetValues {
            percent: self.config.percent,
            min_per_second: self.config.min_per_second,
            window: self.config.window,
            shadow: self.config.shadow,
        }
    }

    /// The budget at `scope` a call deposits in and its retries withdraw from:
    /// `NotInstalled` for a distributed budget without a coordinator.
    pub(crate) fn budget(&'static self, scope: &Scope) -> Result<Gated, Error> {
        self.list();
        if self.config.local {
            let coordinator = coordinator::overriding();
            let values =
                Coordinator::resolve(coordinator.as_ref(), self.config.name, &self.values()).values;
            return Ok(Gated::Made(Box::new(Withdrawals::Local {
                site: self,
                scope: scope.clone(),
                values,
            })));
        }
        coordinator::with_current(|coordinator| {
            let cached = scope
                .is_global()
                .then(|| {
                    self.fleet
                        .get_or_init(|| Fleet::new(self, coordinator, scope))
                })
                .filter(|fleet| fleet.coordinator.is(coordinator));
            match cached {
                Some(fleet) => {
                    fleet.note(coordinator);
                    Gated::Kept(fleet)
                }
                None => Gated::Made(Box::new(Withdrawals::Made(Fleet::new(
                    self,
                    coordinator,
                    scope,
                )))),
            }
        })
    }

    /// Counts at `scope`'s local window.
    fn count_locally(
        &self,
        scope: &Scope,
        values: &BudgetValues,
        withdrawal: bool,
    ) -> (bool, Totals) {
        let identity = (self.config.name, self.config.operation, scope);
        let cell = CELLS.get(&self.local, identity, Cell::new);
        let counted = cell.count(values, withdrawal);
        CELLS.release(identity, &cell);
        counted
    }

    /// Reports a withdrawal's decision; whether the retry is made: allowed, or refused by a
    /// budget in shadow mode (then nothing was withdrawn, as for a refused retry).
    fn decided(&self, scope: &Scope, decided: view::Decided, shadow: bool) -> bool {
        let at = self.at(scope).shadowed(shadow);
        events::decided(&at, decided.allowed, decided.stale);
        if !decided.allowed {
            events::exhausted(&at, decided.seen, decided.allowance);
        }
        decided.allowed || shadow
    }
}

/// A site's budget at one distributed identity: its view of the fleet's window, and the
/// values in force there.
#[derive(Debug)]
struct Fleet {
    site: &'static RetryBudgetSite,
    coordinator: WeakCoordinator,
    view: Arc<view::View>,
    values: Mutex<BudgetValues>,
    /// The [`round`](crate::coordinator::uses::Uses::round) the use was last noted in.
    noted: AtomicU64,
}

impl Fleet {
    fn new(site: &'static RetryBudgetSite, coordinator: &Coordinator, scope: &Scope) -> Self {
        let config = &site.config;
        let identity = coordinator.identity(
            PolicyKind::RetryBudget,
            config.name,
            config.operation,
            scope,
        );
        let fleet = Fleet {
            site,
            coordinator: WeakCoordinator::of(coordinator),
            view: view::Views::of(coordinator, &identity),
            values: Mutex::new(site.values()),
            noted: AtomicU64::new(u64::MAX),
        };
        fleet.note(coordinator);
        fleet
    }

    /// Notes the site's use of the identity with the values in force, unless it was noted
    /// in this round already (the values cannot have changed then).
    fn note(&self, coordinator: &Coordinator) {
        let uses = coordinator.uses();
        let round = uses.round();
        if self.noted.load(Ordering::Acquire) == round {
            return;
        }
        // Resolved under the lock, so values resolved later are never overwritten by ones
        // resolved earlier.
        let mut values = lock(&self.values);
        if self.noted.load(Ordering::Acquire) == round {
            return;
        }
        let resolved = Coordinator::resolve(
            Some(coordinator),
            self.site.config.name,
            &self.site.values(),
        );
        uses.note_use(self.view.identity(), self.site, &resolved);
        self.view.set_window(resolved.values.window);
        *values = resolved.values;
        self.noted.store(round, Ordering::Release);
    }

    /// Withdraws one retry if the fleet's budget, as this process sees it, allows it.
    fn withdraw(&self) -> bool {
        // A budget whose coordinator is gone allows nothing: it never runs uncoordinated.
        let Some(coordinator) = self.coordinator.upgrade() else {
            return false;
        };
        let values = *lock(&self.values);
        let decided =
            self.view
                .withdraw(&coordinator, values.window, &values.allowance(), degraded);
        self.site
            .decided(&self.view.identity().scope, decided, values.shadow)
    }

    /// Deposits one first attempt; none once the coordinator is gone.
    fn deposit(&self) {
        if let Some(coordinator) = self.coordinator.upgrade() {
            self.view.deposit(&coordinator, degraded);
        }
    }
}

impl Gate for Fleet {
    fn deposit(&self) {
        Fleet::deposit(self);
    }

    fn another(&self) -> bool {
        self.withdraw()
    }

    fn budget(&self) -> &str {
        self.site.config.name
    }
}

/// The budget one call's retries withdraw from, made for the call: the call's gate.
#[derive(Debug)]
enum Withdrawals {
    /// A fleet budget of another scope or coordinator than the site's cached one.
    Made(Fleet),
    /// The site's window in this process.
    Local {
        site: &'static RetryBudgetSite,
        scope: Scope,
        values: BudgetValues,
    },
}

impl Gate for Withdrawals {
    fn deposit(&self) {
        match self {
            Withdrawals::Made(fleet) => fleet.deposit(),
            Withdrawals::Local {
                site,
                scope,
                values,
            } => {
                site.count_locally(scope, values, false);
            }
        }
    }

    fn another(&self) -> bool {
        match self {
            Withdrawals::Made(fleet) => fleet.withdraw(),
            Withdrawals::Local {
                site,
                scope,
                values,
            } => {
                let (allowed, seen) = site.count_locally(scope, values, true);
                let decided = view::Decided {
                    allowed,
                    seen,
                    allowance: values.allowance().of(seen.deposits),
                    stale: false,
                };
                site.decided(scope, decided, values.shadow)
            }
        }
    }

    fn budget(&self) -> &str {
        match self {
            Withdrawals::Made(fleet) => fleet.site.config.name,
            Withdrawals::Local { site, .. } => site.config.name,
        }
    }
}

/// Reports a batch the coordinator did not answer.
fn degraded(identity: &Identity, error: &Error) {
    events::degraded(&identity.at(), error);
}

/// Gates the call's retries (the `#[retry]` inside) on the budget, and deposits its first
/// attempt once it has reached the downstream (see `CallCtx::deposit_first`).
#[doc(hidden)]
pub async fn retry_budget<T, E, F>(
    site: &'static RetryBudgetSite,
    ctx: &CallCtx,
    scope: &Result<Scope, Error>,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let scope = ctx.scope(scope)?;
    let budget = site.budget(scope).map_err(|error| ctx.reject(error))?;
    ctx.gate(budget);
    let result = body.await;
    ctx.deposit_first();
    result
}

#[cfg(feature = "tower")]
pub use self::tower::RetryBudget;
