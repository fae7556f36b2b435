//! When the next cycle starts: the pure half of the scheduler.
//!
//! The regular tick (`EXPIRATION_INTERVAL`) is the floor of the schedule:
//! rows nobody announced, rows skipped because someone held them, poison rows
//! and clock trouble are all picked up by it. With deadline wake-up on, the
//! scheduler also wakes just after the earliest deadline it saw at the end of
//! the last cycle, so a booking expires within a moment of its deadline
//! instead of up to a whole interval later. A minimum gap between the end of
//! one cycle and the start of the next coalesces deadlines that lie close
//! together into one cycle and bounds the database work however the
//! deadlines fall.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// How long after a deadline the cycle starts. The predicate is strict
/// (`deadline < as_of`) and `as_of` keeps microseconds; the margin also
/// absorbs a wall clock that NTP slews slightly slower than the monotonic
/// clock the sleep is measured on.
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(5);

/// The schedule's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakePolicy {
    /// The regular tick.
    pub interval: Duration,
    /// Wake at the next known deadline as well as at the tick.
    pub deadline_wake: bool,
    /// No cycle starts sooner than this after the previous one ended.
    pub min_gap: Duration,
}

/// What the scheduler knows when it picks the next wake-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakeInputs {
    /// The instance's wall clock now.
    pub now: DateTime<Utc>,
    /// Time left until the next regular tick.
    pub until_tick: Duration,
    /// Time since the last cycle ended (`None` before the first cycle).
    pub since_last_cycle: Option<Duration>,
    /// The earliest deadline among active rows that was not yet due at the
    /// last cycle's `as_of` (`None`: no such row, or the probe failed).
    pub next_deadline: Option<DateTime<Utc>>,
    /// The last cycle stopped at its time budget with full batches: due rows
    /// are known to be waiting now.
    pub backlog_left: bool,
}

/// Why the scheduler wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeReason {
    Tick,
    Deadline,
    Backlog,
}

impl WakeReason {
    /// Label for logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            WakeReason::Tick => "tick",
            WakeReason::Deadline => "deadline",
            WakeReason::Backlog => "backlog",
        }
    }
}

/// The next wake-up: how long to sleep from `inputs.now`, and why.
pub fn next_wake(policy: &WakePolicy, inputs: &WakeInputs) -> (Duration, WakeReason) {
    let mut wait = (inputs.until_tick, WakeReason::Tick);
    if policy.deadline_wake {
        if inputs.backlog_left {
            wait = (Duration::ZERO, WakeReason::Backlog);
        } else if let Some(deadline) = inputs.next_deadline {
            // A deadline already behind `now` gives a negative span: wake at once.
            let until_deadline =
                (deadline - inputs.now).to_std().unwrap_or(Duration::ZERO) + DEADLINE_MARGIN;
            if until_deadline < wait.0 {
                wait = (until_deadline, WakeReason::Deadline);
            }
        }
    }
    let gap_left = inputs
        .since_last_cycle
        .map_or(Duration::ZERO, |since| policy.min_gap.saturating_sub(since));
    (wait.0.max(gap_left), wait.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: WakePolicy = WakePolicy {
        interval: Duration::from_secs(60),
        deadline_wake: true,
        min_gap: Duration::from_millis(250),
    };

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("valid time")
    }

    fn inputs() -> WakeInputs {
        WakeInputs {
            now: at(0),
            until_tick: Duration::from_secs(60),
            since_last_cycle: Some(Duration::from_secs(1)),
            next_deadline: None,
            backlog_left: false,
        }
    }

    #[test]
    fn without_a_deadline_the_tick_decides() {
        assert_eq!(
            next_wake(&POLICY, &inputs()),
            (Duration::from_secs(60), WakeReason::Tick)
        );
    }

    #[test]
    fn wakes_just_after_a_deadline_before_the_tick() {
        let wake = next_wake(
            &POLICY,
            &WakeInputs {
                next_deadline: Some(at(7)),
                ..inputs()
            },
        );
        assert_eq!(
            wake,
            (
                Duration::from_secs(7) + DEADLINE_MARGIN,
                WakeReason::Deadline
            )
        );
        assert!(
            wake.0 > Duration::from_secs(7),
            "never at the deadline itself"
        );
    }

    #[test]
    fn a_deadline_after_the_tick_waits_for_the_tick() {
        let wake = next_wake(
            &POLICY,
            &WakeInputs {
                next_deadline: Some(at(90)),
                ..inputs()
            },
        );
        assert_eq!(wake, (Duration::from_secs(60), WakeReason::Tick));
    }

    #[test]
    fn the_fixed_schedule_ignores_deadlines_and_backlog() {
        let fixed = WakePolicy {
            deadline_wake: false,
            ..POLICY
        };
        let wake = next_wake(
            &fixed,
            &WakeInputs {
                next_deadline: Some(at(7)),
                backlog_left: true,
                ..inputs()
            },
        );
        assert_eq!(wake, (Duration::from_secs(60), WakeReason::Tick));
    }

    #[test]
    fn the_minimum_gap_coalesces_close_deadlines() {
        // The last cycle ended 100 ms ago and the next deadline is 10 ms away:
        // the cycle waits for the gap, and takes every deadline up to then.
        let now = at(0);
        let wake = next_wake(
            &POLICY,
            &WakeInputs {
                now,
                since_last_cycle: Some(Duration::from_millis(100)),
                next_deadline: Some(now + chrono::Duration::milliseconds(10)),
                ..inputs()
            },
        );
        assert_eq!(wake, (Duration::from_millis(150), WakeReason::Deadline));
    }

    #[test]
    fn a_deadline_already_past_wakes_after_the_gap_only() {
        // A clamped as_of (clock skew) can leave a deadline behind `now` that
        // the cycle could not take: the gap keeps that from becoming a busy loop.
        let wake = next_wake(
            &POLICY,
            &WakeInputs {
                since_last_cycle: Some(Duration::ZERO),
                next_deadline: Some(at(-3)),
                ..inputs()
            },
        );
        assert_eq!(wake, (POLICY.min_gap, WakeReason::Deadline));
    }

    #[test]
    fn a_backlog_left_by_the_budget_continues_after_the_gap() {
        let wake = next_wake(
            &POLICY,
            &WakeInputs {
                since_last_cycle: Some(Duration::from_millis(50)),
                backlog_left: true,
                ..inputs()
            },
        );
        assert_eq!(wake, (Duration::from_millis(200), WakeReason::Backlog));
    }

    #[test]
    fn the_first_cycle_has_no_gap_to_keep() {
        let wake = next_wake(
            &POLICY,
            &WakeInputs {
                until_tick: Duration::ZERO,
                since_last_cycle: None,
                ..inputs()
            },
        );
        assert_eq!(wake, (Duration::ZERO, WakeReason::Tick));
    }

    #[test]
    fn the_wait_never_exceeds_the_tick_or_undercuts_the_gap() {
        for deadline in -5..120 {
            for since_ms in [0u64, 100, 250, 1000] {
                let input = WakeInputs {
                    next_deadline: Some(at(deadline)),
                    since_last_cycle: Some(Duration::from_millis(since_ms)),
                    ..inputs()
                };
                let (wait, _) = next_wake(&POLICY, &input);
                let gap_left = POLICY
                    .min_gap
                    .saturating_sub(Duration::from_millis(since_ms));
                assert!(
                    wait <= input.until_tick.max(gap_left),
                    "{deadline} {since_ms}"
                );
                assert!(wait >= gap_left, "{deadline} {since_ms}");
            }
        }
    }
}
