//! The clock check of a cycle, pure: `as_of` is the instance's clock, never
//! more than `EXPIRATION_MAX_CLOCK_SKEW` ahead of the database clock; and
//! how often the scheduler says so while it lasts.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// How often the scheduler logs that the clock is still out of skew; the
/// metrics count every cycle.
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// `as_of` from the local and the database clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsOf {
    pub at: DateTime<Utc>,
    /// How far the local clock ran ahead of the database clock, when that
    /// was more than the bound and `at` was clamped to database + bound.
    pub clamped_ahead_by: Option<chrono::Duration>,
}

/// `local`, or `database + max_skew` when `local` is further ahead.
pub fn bounded(
    local: DateTime<Utc>,
    database: DateTime<Utc>,
    max_skew: std::time::Duration,
) -> AsOf {
    // Checked: no bound a setting allows overflows (config::catalog), and
    // one that did would be no bound at all rather than a panic.
    let bound = chrono::Duration::from_std(max_skew)
        .ok()
        .and_then(|skew| database.checked_add_signed(skew));
    match bound {
        Some(bound) if local > bound => AsOf {
            at: bound,
            clamped_ahead_by: Some(local - database),
        },
        _ => AsOf {
            at: local,
            clamped_ahead_by: None,
        },
    }
}

/// The warning of a clock out of skew, at most once per [`WARN_EVERY`]
/// while it lasts, with the number of cycles clamped since the last one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkewWarnings<I> {
    last: Option<I>,
    clamped_since: u64,
}

impl<I> Default for SkewWarnings<I> {
    fn default() -> Self {
        Self {
            last: None,
            clamped_since: 0,
        }
    }
}

impl<I: Copy + Ord + std::ops::Add<Duration, Output = I>> SkewWarnings<I> {
    /// A cycle whose `as_of` was clamped, at `now`: `Some(cycles)` when the
    /// warning is due (the cycles clamped since the last one, this one
    /// included), `None` while it would repeat itself.
    pub fn clamped(&mut self, now: I) -> Option<u64> {
        self.clamped_since += 1;
        if self.last.is_some_and(|last| now < last + WARN_EVERY) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.clamped_since))
    }

    /// A cycle within the bound: true when the clock just came back (say
    /// so once), and the next clamped cycle warns at once.
    pub fn within(&mut self) -> bool {
        let was_out = self.last.is_some();
        *self = Self::default();
        was_out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).expect("a time")
    }

    #[test]
    fn a_clock_ahead_beyond_the_bound_is_clamped() {
        let skew = Duration::from_secs(2);
        assert_eq!(bounded(at(1_000), at(0), skew).clamped_ahead_by, None);
        assert_eq!(
            bounded(at(2_000), at(0), skew).at,
            at(2_000),
            "at the bound"
        );
        let ahead = bounded(at(3_600_000), at(0), skew);
        assert_eq!(ahead.at, at(2_000));
        assert_eq!(ahead.clamped_ahead_by, Some(chrono::Duration::hours(1)));
        assert_eq!(
            bounded(at(-5_000), at(0), skew).at,
            at(-5_000),
            "a slow clock"
        );
    }

    /// The panic: a huge bound added to the database time. No
    /// setting allows one any more, and the check does not panic on it.
    #[test]
    fn any_bound_at_any_time_never_panics() {
        for skew in [
            Duration::ZERO,
            Duration::from_secs(3600),
            Duration::from_secs(10_000_000 * 86_400),
            Duration::from_secs(u64::MAX),
        ] {
            for (local, database) in [
                (DateTime::<Utc>::MAX_UTC, DateTime::<Utc>::MIN_UTC),
                (DateTime::<Utc>::MAX_UTC, DateTime::<Utc>::MAX_UTC),
                (at(0), DateTime::<Utc>::MAX_UTC),
            ] {
                let as_of = bounded(local, database, skew);
                assert!(as_of.at <= local);
            }
        }
    }

    #[test]
    fn the_warning_comes_once_a_minute_with_the_cycles_since() {
        let mut warnings = SkewWarnings::<Duration>::default();
        let s = Duration::from_secs;
        assert_eq!(warnings.clamped(s(0)), Some(1), "at once");
        for t in 1..60 {
            assert_eq!(warnings.clamped(s(t)), None, "{t}");
        }
        assert_eq!(warnings.clamped(s(60)), Some(60));
        assert_eq!(warnings.clamped(s(61)), None);
        assert!(warnings.within(), "back within the bound: said once");
        assert!(!warnings.within());
        assert_eq!(warnings.clamped(s(62)), Some(1), "out again: at once");
    }
}
