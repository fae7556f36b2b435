//! When the next cycle starts: the pure half of the scheduler.
//!
//! The regular tick (`EXPIRATION_INTERVAL`) is the floor of the schedule:
//! rows nobody announced, rows skipped because someone held them, poison rows
//! and clock trouble are all picked up by it. With deadline wake-up on, the
//! scheduler also wakes just after the earliest deadline it saw at the end of
//! the last cycle, so a booking expires within a moment of its deadline
//! instead of up to a whole interval later. A minimum gap between the starts
//! of two cycles coalesces deadlines that lie close together into one cycle
//! and bounds the cycles a second however the deadlines fall. It is counted
//! from the start, not the end, of the previous cycle: a cycle that took
//! longer than the gap (a load that fills it) is followed at once while rows
//! are due, not after another gap of idle time in which they wait.
//!
//! A local clock further ahead of the database clock than
//! `EXPIRATION_MAX_CLOCK_SKEW` clamps `as_of`, so deadlines the local clock
//! sees as past are not due to the cycle: waking for them (or for a backlog
//! or a probe) would run a cycle every minimum gap for nothing. While the
//! last cycle was clamped the schedule is the tick alone.
//!
//! A deadline can also appear while the worker sleeps: crm inserts a booking,
//! or moves a deadline earlier, after the worker last read the next one.
//! While a sleep would last longer than [`PROBE_INTERVAL`], the scheduler
//! wakes every [`PROBE_INTERVAL`] only to read the next deadline again (one
//! index probe per phase, no cycle), so a booking committed at least
//! `PROBE_INTERVAL` plus a probe's time before its deadline is known before
//! the deadline, and expires just after it. That costs at most 60 probes a
//! minute per instance, whatever crm writes; the probe works through any
//! pooler (it is a plain read), unlike LISTEN.
//!
//! A cycle that failed (the database gone or failing over, a statement
//! refused) rolled its batch back and read no next deadline. It is tried
//! again after a backoff ([`RETRY_FIRST`], doubling up to the interval)
//! rather than at the tick: the bookings that fell due during a failover of
//! a few seconds expire about that much later, not up to an interval later,
//! and a database that stays down gets a cycle per interval, as before.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// How long after a deadline the cycle starts. The predicate is strict
/// (`deadline < as_of`) and `as_of` keeps microseconds; the margin also
/// absorbs a wall clock that NTP slews slightly slower than the monotonic
/// clock the sleep is measured on.
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(5);

/// How often a sleeping scheduler reads the next deadline again. A booking
/// committed 2 s before its deadline is seen by the probe at most this long
/// after its commit, with a second to spare for a slow probe on a loaded
/// host; 60 probes a minute per instance at most.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The first wait before a failed cycle is tried again (half to all of it,
/// jittered); each failure in a row doubles it, up to the interval.
pub const RETRY_FIRST: Duration = Duration::from_millis(500);

/// The schedule's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakePolicy {
    /// The regular tick.
    pub interval: Duration,
    /// Wake at the next known deadline as well as at the tick.
    pub deadline_wake: bool,
    /// No cycle starts sooner than this after the previous one started.
    pub min_gap: Duration,
    /// With deadline wake-up on: a sleep longer than this is cut into
    /// probes of the next deadline this far apart ([`PROBE_INTERVAL`]).
    pub probe_interval: Duration,
}

/// What the scheduler knows when it picks the next wake-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakeInputs {
    /// The instance's wall clock now.
    pub now: DateTime<Utc>,
    /// Time left until the next regular tick.
    pub until_tick: Duration,
    /// Time since the last cycle started (`None` before the first cycle).
    pub since_last_cycle: Option<Duration>,
    /// The earliest deadline among active rows that was not yet due at the
    /// last cycle's `as_of` (`None`: no such row, or the probe failed).
    pub next_deadline: Option<DateTime<Utc>>,
    /// The last cycle left due rows it could take right away (see
    /// [`backlog_left`]).
    pub backlog_left: bool,
    /// The next deadline can be read again while sleeping (the last cycle
    /// succeeded, so its `as_of` is known).
    pub can_probe: bool,
    /// The last cycle's `as_of` was clamped: the local clock ran ahead of
    /// the database clock by more than `EXPIRATION_MAX_CLOCK_SKEW`.
    pub clock_ahead: bool,
    /// This instance is the waker: the one that wakes at each deadline and
    /// probes for new ones (one at a time; the others keep the tick).
    pub waker: bool,
    /// Another instance is the waker and says it has due rows left: this
    /// one cycles too, every minimum gap, until it has none.
    pub helping: bool,
    /// The last cycle failed: the time left until it is tried again
    /// ([`RETRY_FIRST`] and on).
    pub retry_in: Option<Duration>,
}

/// Why the scheduler wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeReason {
    Tick,
    Deadline,
    Backlog,
    /// No cycle: read the next deadline again, then decide anew.
    Probe,
    /// The last cycle failed.
    Retry,
}

impl WakeReason {
    /// Label for logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            WakeReason::Tick => "tick",
            WakeReason::Deadline => "deadline",
            WakeReason::Backlog => "backlog",
            WakeReason::Probe => "probe",
            WakeReason::Retry => "retry",
        }
    }
}

/// The next wake-up: how long to sleep from `inputs.now`, and why.
pub fn next_wake(policy: &WakePolicy, inputs: &WakeInputs) -> (Duration, WakeReason) {
    let gap_left = inputs
        .since_last_cycle
        .map_or(Duration::ZERO, |since| policy.min_gap.saturating_sub(since));
    if inputs.clock_ahead {
        // Back off to the tick: no deadline, backlog or probe wake-up.
        return (inputs.until_tick.max(gap_left), WakeReason::Tick);
    }
    let mut wait = (inputs.until_tick, WakeReason::Tick);
    // Only the waker wakes at deadlines and probes; any instance with due
    // rows left, or helping a busy waker, goes on every minimum gap.
    let deadlines = policy.deadline_wake && inputs.waker;
    if policy.deadline_wake {
        if inputs.backlog_left || inputs.helping {
            wait = (Duration::ZERO, WakeReason::Backlog);
        } else if let Some(deadline) = inputs.next_deadline.filter(|_| deadlines) {
            // A deadline already behind `now` gives a negative span: wake at once.
            let until_deadline =
                (deadline - inputs.now).to_std().unwrap_or(Duration::ZERO) + DEADLINE_MARGIN;
            if until_deadline < wait.0 {
                wait = (until_deadline, WakeReason::Deadline);
            }
        }
    }
    if let Some(retry) = inputs.retry_in
        && retry < wait.0
    {
        wait = (retry, WakeReason::Retry);
    }
    let wait = (wait.0.max(gap_left), wait.1);
    // A deadline written during the sleep must not wait for the tick: a long
    // sleep is cut into probes (the gap is the next cycle's, not a probe's).
    if deadlines && inputs.can_probe && wait.0 > policy.probe_interval {
        return (policy.probe_interval, WakeReason::Probe);
    }
    wait
}

/// Whether the cycle that just ended left due rows that a cycle right after
/// the minimum gap can take, instead of leaving them for the tick: it stopped
/// at its time budget, or a phase stopped at `EXPIRATION_MAX_BATCHES_PER_CYCLE`
/// with a full last batch. The next cycle always gets further: it goes on
/// after the last row the sweep took (`sweep`), so a full batch of refused
/// rows is not read again, and the loop ends when a batch comes back short.
pub fn backlog_left(budget_exhausted: bool, batch_cap_reached: bool) -> bool {
    budget_exhausted || batch_cap_reached
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: WakePolicy = WakePolicy {
        interval: Duration::from_secs(60),
        deadline_wake: true,
        min_gap: Duration::from_millis(250),
        probe_interval: PROBE_INTERVAL,
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
            can_probe: false,
            clock_ahead: false,
            waker: true,
            helping: false,
            retry_in: None,
        }
    }

    /// An instance that is not the waker keeps the tick: no deadline, no
    /// probe; it cycles every minimum gap only while it, or the waker it
    /// helps, has due rows left.
    #[test]
    fn only_the_waker_wakes_at_deadlines_and_probes() {
        let follower = WakeInputs {
            waker: false,
            next_deadline: Some(at(7)),
            can_probe: true,
            ..inputs()
        };
        assert_eq!(
            next_wake(&POLICY, &follower),
            (Duration::from_secs(60), WakeReason::Tick)
        );
        let helping = WakeInputs {
            helping: true,
            since_last_cycle: Some(Duration::from_millis(100)),
            ..follower
        };
        assert_eq!(
            next_wake(&POLICY, &helping),
            (Duration::from_millis(150), WakeReason::Backlog)
        );
    }

    /// A failed cycle is tried again after its backoff, not at the tick,
    /// on every instance and with deadline wake-up off too; the minimum gap
    /// still holds, and a tick that comes sooner serves it.
    #[test]
    fn a_failed_cycle_is_retried_after_its_backoff_not_at_the_tick() {
        let failed = WakeInputs {
            retry_in: Some(Duration::from_millis(400)),
            since_last_cycle: Some(Duration::ZERO),
            ..inputs()
        };
        let retry = (Duration::from_millis(400), WakeReason::Retry);
        assert_eq!(next_wake(&POLICY, &failed), retry);
        let follower = WakeInputs {
            waker: false,
            ..failed
        };
        assert_eq!(next_wake(&POLICY, &follower), retry);
        let fixed = WakePolicy {
            deadline_wake: false,
            ..POLICY
        };
        assert_eq!(next_wake(&fixed, &failed), retry);
        let soon = WakeInputs {
            retry_in: Some(Duration::from_millis(100)),
            ..failed
        };
        assert_eq!(
            next_wake(&POLICY, &soon),
            (POLICY.min_gap, WakeReason::Retry)
        );
        let tick_first = WakeInputs {
            until_tick: Duration::from_millis(300),
            ..failed
        };
        assert_eq!(
            next_wake(&POLICY, &tick_first),
            (Duration::from_millis(300), WakeReason::Tick)
        );
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
        // The last cycle started 100 ms ago and the next deadline is 10 ms away:
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

    #[test]
    fn a_long_sleep_is_cut_into_probes_of_the_next_deadline() {
        let probing = WakeInputs {
            can_probe: true,
            ..inputs()
        };
        assert_eq!(
            next_wake(&POLICY, &probing),
            (PROBE_INTERVAL, WakeReason::Probe)
        );
        // A deadline 7 s away: probe until it is closer than a probe interval.
        let known = WakeInputs {
            next_deadline: Some(at(7)),
            ..probing
        };
        assert_eq!(
            next_wake(&POLICY, &known),
            (PROBE_INTERVAL, WakeReason::Probe)
        );
        let close = WakeInputs {
            now: at(7) - chrono::Duration::milliseconds(400),
            ..known
        };
        assert_eq!(
            next_wake(&POLICY, &close),
            (
                Duration::from_millis(400) + DEADLINE_MARGIN,
                WakeReason::Deadline
            )
        );
    }

    #[test]
    fn no_probe_when_it_cannot_or_need_not_run() {
        // Before the first successful cycle, on the fixed schedule, and when
        // the wake is no further than one probe interval.
        assert_eq!(next_wake(&POLICY, &inputs()).1, WakeReason::Tick);
        let fixed = WakePolicy {
            deadline_wake: false,
            ..POLICY
        };
        let probing = WakeInputs {
            can_probe: true,
            ..inputs()
        };
        assert_eq!(next_wake(&fixed, &probing).1, WakeReason::Tick);
        let backlog = WakeInputs {
            backlog_left: true,
            since_last_cycle: Some(Duration::ZERO),
            ..probing
        };
        assert_eq!(
            next_wake(&POLICY, &backlog),
            (POLICY.min_gap, WakeReason::Backlog)
        );
        let soon = WakeInputs {
            until_tick: PROBE_INTERVAL,
            ..probing
        };
        assert_eq!(
            next_wake(&POLICY, &soon),
            (PROBE_INTERVAL, WakeReason::Tick)
        );
    }

    #[test]
    fn probes_are_bounded_by_the_interval_whatever_the_deadlines() {
        // However far the tick or the deadline, a wake comes at least every
        // probe interval and never sooner than the gap allows for a cycle:
        // at most 60 probes a minute.
        for deadline in [None, Some(at(-1)), Some(at(2)), Some(at(59))] {
            for until_tick in [0u64, 500, 1000, 30_000, 60_000] {
                let input = WakeInputs {
                    can_probe: true,
                    next_deadline: deadline,
                    until_tick: Duration::from_millis(until_tick),
                    ..inputs()
                };
                let (wait, reason) = next_wake(&POLICY, &input);
                assert!(wait <= PROBE_INTERVAL, "{deadline:?} {until_tick}");
                if reason == WakeReason::Probe {
                    assert_eq!(wait, PROBE_INTERVAL);
                }
            }
        }
    }

    #[test]
    fn a_cycle_stopped_early_continues_after_the_gap() {
        // The budget ran out, or a phase stopped at the cap: the next cycle
        // goes on after the sweep's position.
        assert!(backlog_left(true, false));
        assert!(backlog_left(false, true));
        // Every phase reached a short batch: the schedule decides.
        assert!(!backlog_left(false, false));
    }

    /// The spin: a clock out of skew left deadlines behind `now`
    /// that the clamped cycle could not take, and the scheduler ran a cycle
    /// every minimum gap. Now it waits for the tick, whatever is known.
    #[test]
    fn a_clock_out_of_skew_backs_off_to_the_tick() {
        let ahead = WakeInputs {
            clock_ahead: true,
            since_last_cycle: Some(Duration::ZERO),
            until_tick: Duration::from_secs(37),
            ..inputs()
        };
        for deadline in [None, Some(at(-3)), Some(at(1))] {
            for (backlog_left, can_probe) in [(false, false), (true, true), (false, true)] {
                let input = WakeInputs {
                    next_deadline: deadline,
                    backlog_left,
                    can_probe,
                    ..ahead
                };
                assert_eq!(
                    next_wake(&POLICY, &input),
                    (Duration::from_secs(37), WakeReason::Tick),
                    "{input:?}"
                );
            }
        }
        // At the tick itself, still no sooner than the gap.
        let at_tick = WakeInputs {
            until_tick: Duration::ZERO,
            ..ahead
        };
        assert_eq!(
            next_wake(&POLICY, &at_tick),
            (POLICY.min_gap, WakeReason::Tick)
        );
    }
}
