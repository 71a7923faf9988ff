//! The budget as `tower::retry::Retry` takes one.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use caracal_spec::retry_budget as spec;

use super::{RetryBudgetConfig, RetryBudgetSite};
use crate::ctx::Gated;
use crate::identity::{Scope, intern};
use crate::sync::lock;

/// A retry budget for [`tower::retry::Retry`] policies, sharing its identity (name,
/// operation, scope) with `#[retry_budget]`: [`deposit`](tower::retry::budget::Budget::deposit)
/// on every request, [`withdraw`](tower::retry::budget::Budget::withdraw) before every
/// retry, both decided from this process's view of the fleet's window (no round trip).
///
/// ```
/// use tower::retry::budget::Budget;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let budget = caracal::tower::RetryBudget::new("partner-api").percent(20).local(true);
/// budget.deposit();
/// assert!(budget.withdraw()); // the floor: 10 retries per second
/// # }
/// ```
#[derive(Debug)]
pub struct RetryBudget {
    config: RetryBudgetConfig,
    scope: Scope,
    /// The site, made on first use (the settings are final then).
    site: OnceLock<&'static RetryBudgetSite>,
    /// The last deposit's budget, which withdrawals draw from.
    current: Mutex<Option<Gated>>,
}

impl RetryBudget {
    /// The budget of `name` (operation = name, scope global), with the attribute's
    /// defaults.
    ///
    /// # Panics
    /// On a `name` that is no valid identity part.
    pub fn new(name: &str) -> Self {
        let name = intern(name);
        RetryBudget {
            config: RetryBudgetConfig {
                name,
                operation: name,
                percent: spec::PERCENT.default.integer(),
                min_per_second: spec::MIN_PER_SECOND.default.integer(),
                window: spec::WINDOW.default.duration(),
                local: false,
                shadow: spec::SHADOW.default.flag(),
            },
            scope: Scope::GLOBAL,
            site: OnceLock::new(),
            current: Mutex::default(),
        }
    }

    /// Retries allowed per 100 requests.
    ///
    /// # Panics
    /// Out of the attribute's bounds, as every setter.
    pub fn percent(mut self, percent: u32) -> Self {
        self.config.percent = within(&spec::PERCENT, percent);
        self
    }

    /// Retries allowed per second whatever the traffic.
    pub fn min_per_second(mut self, min_per_second: u32) -> Self {
        self.config.min_per_second = within(&spec::MIN_PER_SECOND, min_per_second);
        self
    }

    /// How far back requests and retries count.
    pub fn window(mut self, window: Duration) -> Self {
        let caracal_spec::Type::Duration { min, max } = spec::WINDOW.ty else {
            unreachable!("a duration key")
        };
        assert!(
            (min..=max).contains(&window),
            "`window` must be from {} to {}",
            caracal_spec::Human(min),
            caracal_spec::Human(max)
        );
        self.config.window = window;
        self
    }

    /// The operation (default: the name).
    pub fn operation(mut self, operation: &str) -> Self {
        self.config.operation = intern(operation);
        self
    }

    /// The scope (default global).
    ///
    /// # Panics
    /// On a scope that is no valid identity part.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Scope::new(scope.into()).expect("a valid scope");
        self
    }

    /// Keeps the window in this process.
    pub fn local(mut self, local: bool) -> Self {
        self.config.local = local;
        self
    }

    /// Shadow mode, as `#[retry_budget(shadow = true)]`: a retry over the budget is
    /// allowed anyway, without being withdrawn, and counted as `would_reject`.
    ///
    /// ```
    /// use tower::retry::budget::Budget;
    /// let budget = caracal::tower::RetryBudget::new("shadowed").percent(0).min_per_second(0)
    ///     .local(true).shadow(true);
    /// budget.deposit();
    /// assert!(budget.withdraw(), "over the budget, allowed in shadow mode");
    /// ```
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.config.shadow = shadow;
        self
    }

    fn site(&self) -> &'static RetryBudgetSite {
        // One site per budget, for the program's life: budgets are made at start-up, as
        // an attribute's site is compiled in.
        self.site
            .get_or_init(|| Box::leak(Box::new(RetryBudgetSite::new(self.config.clone()))))
    }
}

/// `value`, if `key` (an integer key) accepts it.
fn within(key: &caracal_spec::Key, value: u32) -> u32 {
    let caracal_spec::Type::Integer { min, max } = key.ty else {
        unreachable!("an integer key")
    };
    assert!(
        (min..=max).contains(&value),
        "`{}` must be an integer from {min} to {max}",
        key.name
    );
    value
}

impl tower::retry::budget::Budget for RetryBudget {
    fn deposit(&self) {
        // A distributed budget without a coordinator counts nothing, and then allows no
        // withdrawal: it never runs uncoordinated.
        let budget = self.site().budget(&self.scope).ok();
        if let Some(budget) = &budget {
            budget.deposit();
        }
        *lock(&self.current) = budget;
    }

    fn withdraw(&self) -> bool {
        lock(&self.current).as_ref().is_some_and(Gated::another)
    }
}
