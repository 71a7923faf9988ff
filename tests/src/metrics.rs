//! A `metrics` recorder whose values the suites (and worker processes) read back.
//!
//! It keeps every series in metrics-util's registry with atomic storage, the building block
//! exporters use, and reads it without resetting anything: metrics-util's
//! `DebuggingRecorder` zeroes every counter and gauge on each snapshot, so a test waiting for a
//! gauge, which reads it again and again, would see it fall to 0 on the second read.
//!
//! [`MetricsLog::global`] installs one as the process's recorder. Every test of a binary
//! shares it, so select series by a label unique to your test (a policy `name`).

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};

/// Every series recorded so far; clones read the same ones.
#[derive(Clone)]
pub struct MetricsLog {
    registry: Arc<Registry<Key, AtomicStorage>>,
}

impl std::fmt::Debug for MetricsLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.dump())
    }
}

impl Default for MetricsLog {
    fn default() -> Self {
        MetricsLog {
            registry: Arc::new(Registry::atomic()),
        }
    }
}

/// Whether `key` carries every one of `labels`.
fn matches(key: &Key, labels: &[(&str, &str)]) -> bool {
    labels.iter().all(|(name, value)| {
        key.labels()
            .any(|label| label.key() == *name && label.value() == *value)
    })
}

impl MetricsLog {
    /// The process-wide log, installed as the global recorder on first call.
    ///
    /// # Panics
    /// When another global recorder was installed first.
    pub fn global() -> &'static MetricsLog {
        static GLOBAL: OnceLock<MetricsLog> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let log = MetricsLog::default();
            metrics::set_global_recorder(log.clone())
                .unwrap_or_else(|_| panic!("MetricsLog::global: another recorder is installed"));
            log
        })
    }

    /// The sum of the counters named `name` that carry every one of `labels`.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut sum = 0;
        self.registry.visit_counters(|key, counter| {
            if key.name() == name && matches(key, labels) {
                sum += counter.load(Ordering::Acquire);
            }
        });
        sum
    }

    /// The gauge named `name` that carries every one of `labels`, if it was ever set.
    ///
    /// # Panics
    /// When several series match: give more labels.
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = Vec::new();
        self.registry.visit_gauges(|key, gauge| {
            if key.name() == name && matches(key, labels) {
                found.push(f64::from_bits(gauge.load(Ordering::Acquire)));
            }
        });
        assert!(
            found.len() <= 1,
            "{} gauges `{name}` match {labels:?}:\n{}",
            found.len(),
            self.dump()
        );
        found.pop()
    }

    /// Every value recorded in the histograms named `name` that carry every one of `labels`.
    pub fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        let mut values = Vec::new();
        self.registry.visit_histograms(|key, histogram| {
            if key.name() == name && matches(key, labels) {
                values.extend(histogram.data());
            }
        });
        values
    }

    /// Every series and its value, one per line, sorted: for failure messages.
    pub fn dump(&self) -> String {
        let mut lines = Vec::new();
        let show = |key: &Key| {
            let labels: Vec<String> = key
                .labels()
                .map(|label| format!("{}={:?}", label.key(), label.value()))
                .collect();
            format!("{}{{{}}}", key.name(), labels.join(","))
        };
        self.registry.visit_counters(|key, counter| {
            lines.push(format!("{} {}", show(key), counter.load(Ordering::Acquire)));
        });
        self.registry.visit_gauges(|key, gauge| {
            let value = f64::from_bits(gauge.load(Ordering::Acquire));
            lines.push(format!("{} {value}", show(key)));
        });
        self.registry.visit_histograms(|key, histogram| {
            lines.push(format!("{} {} samples", show(key), histogram.data().len()));
        });
        lines.sort();
        lines.iter().fold(String::new(), |mut out, line| {
            let _ = writeln!(out, "{line}");
            out
        })
    }
}

impl Recorder for MetricsLog {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.registry
            .get_or_create_counter(key, |counter| Counter::from_arc(Arc::clone(counter)))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.registry
            .get_or_create_gauge(key, |gauge| Gauge::from_arc(Arc::clone(gauge)))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.registry
            .get_or_create_histogram(key, |histogram| Histogram::from_arc(Arc::clone(histogram)))
    }
}
