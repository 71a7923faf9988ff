//! The breaker's window: how each observed call turned out, their counts, and the batches the
//! window records them in.

use std::collections::VecDeque;

use super::len;

/// How one observed call turned out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Observation {
    pub(crate) failed: bool,
    /// It took longer than the breaker's `slow_call`.
    pub(crate) slow: bool,
}

impl Observation {
    /// The letter the window stores it as.
    pub(crate) fn letter(self) -> char {
        match (self.failed, self.slow) {
            (false, false) => 's',
            (true, false) => 'f',
            (false, true) => 'w',
            (true, true) => 'x',
        }
    }

    /// The observation a window letter stands for.
    #[cfg(test)]
    pub(crate) fn from_letter(letter: char) -> Option<Self> {
        let (failed, slow) = match letter {
            's' => (false, false),
            'f' => (true, false),
            'w' => (false, true),
            'x' => (true, true),
            _ => return None,
        };
        Some(Observation { failed, slow })
    }
}

/// Observations, failures among them, and slow ones among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Counts {
    pub(crate) total: u32,
    pub(crate) failures: u32,
    pub(crate) slow: u32,
}

impl Counts {
    pub(crate) fn of(observations: impl IntoIterator<Item = Observation>) -> Self {
        observations
            .into_iter()
            .fold(Counts::default(), |mut counts, observation| {
                counts.total += 1;
                counts.failures += u32::from(observation.failed);
                counts.slow += u32::from(observation.slow);
                counts
            })
    }

    pub(crate) fn add(&mut self, other: Counts) {
        self.total = self.total.saturating_add(other.total);
        self.failures = self.failures.saturating_add(other.failures);
        self.slow = self.slow.saturating_add(other.slow);
    }

    pub(crate) fn remove(&mut self, other: Counts) {
        self.total = self.total.saturating_sub(other.total);
        self.failures = self.failures.saturating_sub(other.failures);
        self.slow = self.slow.saturating_sub(other.slow);
    }
}

/// One recorded batch of the window: when, and each observation, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) at: u64,
    pub(crate) outcomes: Outcomes,
}

/// A batch's observations in order. Batches of up to 64 — nearly all of them — are two
/// bitmasks, so recording an observation allocates nothing.
#[derive(Debug, Clone)]
pub(crate) enum Outcomes {
    /// Bit `i` of each mask is the `i`-th oldest observation.
    Bits {
        failed: u64,
        slow: u64,
        len: u8,
    },
    Spilled(VecDeque<Observation>),
}

impl Outcomes {
    pub(crate) fn from_slice(observations: &[Observation]) -> Self {
        if observations.len() <= 64 {
            let mask = |keep: fn(&Observation) -> bool| {
                observations
                    .iter()
                    .enumerate()
                    .fold(0u64, |bits, (i, o)| bits | (u64::from(keep(o)) << i))
            };
            Outcomes::Bits {
                failed: mask(|o| o.failed),
                slow: mask(|o| o.slow),
                len: observations.len() as u8,
            }
        } else {
            Outcomes::Spilled(observations.iter().copied().collect())
        }
    }

    pub(crate) fn len(&self) -> u32 {
        match self {
            Outcomes::Bits { len, .. } => u32::from(*len),
            Outcomes::Spilled(outcomes) => len(outcomes.len()),
        }
    }

    pub(crate) fn counts(&self) -> Counts {
        match self {
            Outcomes::Bits { failed, slow, len } => Counts {
                total: u32::from(*len),
                failures: failed.count_ones(),
                slow: slow.count_ones(),
            },
            Outcomes::Spilled(outcomes) => Counts::of(outcomes.iter().copied()),
        }
    }

    /// Removes the `n` oldest observations (at most all); returns what they counted.
    pub(super) fn remove_oldest(&mut self, n: u32) -> Counts {
        match self {
            Outcomes::Bits { failed, slow, len } => {
                let n = n.min(u32::from(*len));
                let low = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
                let removed = Counts {
                    total: n,
                    failures: (*failed & low).count_ones(),
                    slow: (*slow & low).count_ones(),
                };
                *failed = failed.checked_shr(n).unwrap_or(0);
                *slow = slow.checked_shr(n).unwrap_or(0);
                *len -= n as u8;
                removed
            }
            Outcomes::Spilled(outcomes) => {
                let n = (n as usize).min(outcomes.len());
                Counts::of(outcomes.drain(..n))
            }
        }
    }

    /// Appends `newer` if both fit in one bitmask; `false` (and nothing changed) otherwise.
    pub(super) fn append(&mut self, newer: &Outcomes) -> bool {
        match (self, newer) {
            (
                Outcomes::Bits { failed, slow, len },
                Outcomes::Bits {
                    failed: more_failed,
                    slow: more_slow,
                    len: extra,
                },
            ) if u32::from(*len) + u32::from(*extra) <= 64 => {
                *failed |= more_failed << *len;
                *slow |= more_slow << *len;
                *len += extra;
                true
            }
            _ => false,
        }
    }

    /// The observations, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Observation> + '_ {
        (0..self.len()).map(move |i| match self {
            Outcomes::Bits { failed, slow, .. } => Observation {
                failed: failed >> i & 1 == 1,
                slow: slow >> i & 1 == 1,
            },
            Outcomes::Spilled(outcomes) => outcomes[i as usize],
        })
    }
}

impl PartialEq for Outcomes {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Outcomes {}
