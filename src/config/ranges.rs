//! The range of every duration and count setting, in one table.
//!
//! Each bound follows from what the setting does; the reason stands beside
//! it here and in docs/configuration.md ("Ranges"), and `--help` shows the
//! range. A value outside it is refused by the setting's value parser
//! ([`super::parse::within`], [`super::parse::count_within`]): the one line
//! of an exit 2, naming the setting and the range, before anything starts.
//! Nothing downstream has to guard against a value no range lets in: the
//! skew bound added to a timestamp, the statement timeout doubled and sent
//! to PostgreSQL as int milliseconds, the stop grace summed.

use std::time::Duration;

use super::defaults::AsText;

/// The values a setting accepts, both bounds included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range<T: 'static> {
    /// The setting's variable (its flag, for flags without one), as its
    /// errors name it.
    pub setting: &'static str,
    pub min: T,
    pub max: T,
}

impl<T: AsText + PartialOrd + Copy> Range<T> {
    /// `100ms to 1h`: the range as `--help`, the docs and the errors write it.
    pub fn text(&self) -> String {
        format!("{} to {}", self.min.as_text(), self.max.as_text())
    }

    pub fn contains(&self, value: T) -> bool {
        self.min <= value && value <= self.max
    }

    /// `value`, or why it is refused (the range, and the value).
    pub fn check(&self, value: T) -> Result<T, String> {
        if self.contains(value) {
            Ok(value)
        } else {
            Err(format!(
                "must be from {}, got {}",
                self.text(),
                value.as_text()
            ))
        }
    }
}

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

const fn minutes(n: u64) -> Duration {
    Duration::from_secs(n * 60)
}

const fn hours(n: u64) -> Duration {
    Duration::from_secs(n * 3600)
}

const fn days(n: u64) -> Duration {
    Duration::from_secs(n * 86_400)
}

const fn duration(setting: &'static str, min: Duration, max: Duration) -> Range<Duration> {
    Range { setting, min, max }
}

const fn count(setting: &'static str, min: u64, max: u64) -> Range<u64> {
    Range { setting, min, max }
}

/// PostgreSQL takes its timeouts as int milliseconds: at most
/// 2,147,483,647 ms (24.8 days); `SET` refuses more.
pub const POSTGRES_MAX_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

// --- durations -----------------------------------------------------------

/// Floor: a TCP, TLS and SCRAM set-up takes about 10 ms on loopback and
/// tens of ms across a data centre; below 100 ms a sound server would be
/// reported unreachable. Ceiling: a pooled checkout waits this long too, so
/// a cycle or a publish batch stalls for up to this long on a dead server
/// before it says so.
pub const DATABASE_CONNECT_TIMEOUT: Range<Duration> =
    duration("DATABASE_CONNECT_TIMEOUT", ms(100), minutes(10));

/// Floor: one batch's statements (lock, write, count) take tens of ms, a
/// few hundred on a loaded server; the same value is the lock timeout.
/// Ceiling: PostgreSQL's int milliseconds ([`POSTGRES_MAX_TIMEOUT`], 24.8
/// days) must hold the idle-in-transaction limit, which is twice this:
/// 12 days keeps both within it (12.5 days made every connection's `SET`
/// fail).
pub const DATABASE_STATEMENT_TIMEOUT: Range<Duration> =
    duration("DATABASE_STATEMENT_TIMEOUT", secs(1), days(12));

/// Floor: the tick starts a cycle (a clock check, a lock query and a count
/// per phase) even when nothing is due; below 100 ms an idle instance
/// would do little else (deadline wake-up already wakes just after each
/// deadline). Ceiling: the tick is what takes rows skipped because they
/// were locked, retries poison rows and ends clock trouble; an hour bounds
/// how long they wait. `/healthz` needs a cycle within `LIVENESS_WINDOW`,
/// so `run` also wants that longer than this.
pub const EXPIRATION_INTERVAL: Range<Duration> = duration("EXPIRATION_INTERVAL", ms(100), hours(1));

/// Floor: a cycle always runs one batch per phase; a budget shorter than a
/// batch (tens of ms) would cut every cycle there. Ceiling: no other cycle
/// starts while one runs, so bookings falling due meanwhile wait up to
/// this long.
pub const EXPIRATION_CYCLE_BUDGET: Range<Duration> =
    duration("EXPIRATION_CYCLE_BUDGET", ms(100), hours(1));

/// Floor: 0 lets `as_of` run no further than the database clock. Ceiling:
/// the check exists so a fast clock cannot expire bookings early; allowing
/// more than an hour is no check (`off` turns it off, said plainly).
pub const EXPIRATION_MAX_CLOCK_SKEW: Range<Duration> =
    duration("EXPIRATION_MAX_CLOCK_SKEW", secs(0), hours(1));

/// Floor: at most 20 cycles a second per instance. Each cycle costs a
/// clock check, a lock query per phase and a commit (a few ms of database
/// time), so however the deadlines fall an instance stays a small load;
/// at 0 a clock out of skew ran a cycle every 5 ms. Ceiling: bookings
/// whose deadlines lie close together expire up to this long after them;
/// past a minute, the fixed schedule (`EXPIRATION_DEADLINE_WAKE=false`)
/// says it better.
pub const EXPIRATION_MIN_GAP: Range<Duration> = duration("EXPIRATION_MIN_GAP", ms(50), minutes(1));

/// Floor: 0 rolls the batch in flight back at once. Ceiling: the
/// orchestrator must wait `SHUTDOWN_GRACE` + `KAFKA_REQUEST_TIMEOUT` + 5 s
/// (Kubernetes' `terminationGracePeriodSeconds`, 40 s in deploy/); a batch
/// is bounded by `DATABASE_STATEMENT_TIMEOUT` anyway.
pub const SHUTDOWN_GRACE: Range<Duration> = duration("SHUTDOWN_GRACE", secs(0), minutes(10));

/// Floor: a second; `run` also wants it longer than `EXPIRATION_INTERVAL`,
/// since an idle instance completes a cycle once per tick. Ceiling: a
/// worker stuck for a day must fail its liveness probe.
pub const LIVENESS_WINDOW: Range<Duration> = duration("LIVENESS_WINDOW", secs(1), days(1));

/// Floor: each poll is a claim query; 10 ms is 100 a second per
/// instance. Ceiling: without a commit wake-up (a transaction pooler and
/// no `DATABASE_DIRECT_URL`) rows wait up to this long before they are
/// published.
pub const OUTBOX_POLL_INTERVAL: Range<Duration> =
    duration("OUTBOX_POLL_INTERVAL", ms(10), minutes(10));

/// Floor: 0 deletes rows right after publishing. Ceiling: published rows
/// are kept for inspection only; `republish` rebuilds any event from the
/// audit trail, so a year is more than any need, and the table grows with
/// every day kept.
pub const OUTBOX_RETENTION: Range<Duration> = duration("OUTBOX_RETENTION", secs(0), days(365));

/// Floor: a produce with `acks=all` takes a few ms on a healthy cluster;
/// below 100 ms every produce would time out. Ceiling: a silent broker
/// holds its partitions' rows this long before they are sent again.
pub const KAFKA_REQUEST_TIMEOUT: Range<Duration> =
    duration("KAFKA_REQUEST_TIMEOUT", ms(100), minutes(10));

/// `seed --spread`. Ceiling: deadlines up to a year ahead.
pub const SEED_SPREAD: Range<Duration> = duration("--spread", secs(0), days(365));

// --- counts ----------------------------------------------------------------

/// Floor: one connection is enough for `once`, `status` and `seed`.
/// Ceiling: each connection is a server process; PostgreSQL's default
/// `max_connections` is 100, and a thousand would starve crm.
pub const DATABASE_POOL_SIZE: Range<u64> = count("DATABASE_POOL_SIZE", 1, 1000);

/// Ceiling: one transaction holds the row locks of the whole batch until it
/// commits, and crm's commands on those bookings wait for it.
pub const EXPIRATION_BATCH_SIZE: Range<u64> = count("EXPIRATION_BATCH_SIZE", 1, 100_000);

/// Floor: one batch per cycle (the draft's literal schedule). Ceiling:
/// `EXPIRATION_CYCLE_BUDGET` bounds a cycle's time; this bounds its work.
pub const EXPIRATION_MAX_BATCHES_PER_CYCLE: Range<u64> =
    count("EXPIRATION_MAX_BATCHES_PER_CYCLE", 1, 1_000_000);

/// Ceiling: one produce request carries the batch; 10,000 events of about
/// 300 bytes are 3 MB, past the brokers' default `message.max.bytes`.
pub const OUTBOX_BATCH_SIZE: Range<u64> = count("OUTBOX_BATCH_SIZE", 1, 10_000);

/// Ceiling: Kafka's own guidance for partitions per broker.
pub const KAFKA_TOPIC_PARTITIONS: Range<u64> = count("KAFKA_TOPIC_PARTITIONS", 1, 10_000);

/// Ceiling: no more replicas than any cluster has brokers in practice.
pub const KAFKA_REPLICATION_FACTOR: Range<u64> = count("KAFKA_REPLICATION_FACTOR", 1, 32);

/// `republish --batch-size`: outbox rows per transaction, as
/// `OUTBOX_BATCH_SIZE`.
pub const REPUBLISH_BATCH_SIZE: Range<u64> = count("--batch-size", 1, 10_000);

/// `seed --active`, `--inactive`, `--poison`: a hundred million rows is
/// about 30 GB, past any demo or load test.
pub const SEED_ACTIVE: Range<u64> = count("--active", 0, 100_000_000);
pub const SEED_INACTIVE: Range<u64> = count("--inactive", 0, 100_000_000);
pub const SEED_POISON: Range<u64> = count("--poison", 0, 100_000_000);

/// Every duration setting's range (`EXPIRATION_MAX_CLOCK_SKEW` also takes
/// `off`).
pub const DURATIONS: [&Range<Duration>; 12] = [
    &DATABASE_CONNECT_TIMEOUT,
    &DATABASE_STATEMENT_TIMEOUT,
    &EXPIRATION_INTERVAL,
    &EXPIRATION_CYCLE_BUDGET,
    &EXPIRATION_MAX_CLOCK_SKEW,
    &EXPIRATION_MIN_GAP,
    &SHUTDOWN_GRACE,
    &LIVENESS_WINDOW,
    &OUTBOX_POLL_INTERVAL,
    &OUTBOX_RETENTION,
    &KAFKA_REQUEST_TIMEOUT,
    &SEED_SPREAD,
];

/// Every count setting's range.
pub const COUNTS: [&Range<u64>; 10] = [
    &DATABASE_POOL_SIZE,
    &EXPIRATION_BATCH_SIZE,
    &EXPIRATION_MAX_BATCHES_PER_CYCLE,
    &OUTBOX_BATCH_SIZE,
    &KAFKA_TOPIC_PARTITIONS,
    &KAFKA_REPLICATION_FACTOR,
    &REPUBLISH_BATCH_SIZE,
    &SEED_ACTIVE,
    &SEED_INACTIVE,
    &SEED_POISON,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statement_timeout_and_its_double_fit_postgres_int_milliseconds() {
        assert!(DATABASE_STATEMENT_TIMEOUT.max * 2 <= POSTGRES_MAX_TIMEOUT);
        // The 12.5 days is out.
        assert!(!DATABASE_STATEMENT_TIMEOUT.contains(hours(12 * 24 + 12)));
    }

    #[test]
    fn ranges_read_as_the_documentation_writes_them() {
        assert_eq!(EXPIRATION_INTERVAL.text(), "100ms to 1h");
        assert_eq!(DATABASE_STATEMENT_TIMEOUT.text(), "1s to 12d");
        assert_eq!(EXPIRATION_MAX_CLOCK_SKEW.text(), "0s to 1h");
        assert_eq!(LIVENESS_WINDOW.text(), "1s to 24h");
        assert_eq!(EXPIRATION_BATCH_SIZE.text(), "1 to 100000");
        assert_eq!(
            EXPIRATION_MIN_GAP.check(Duration::ZERO),
            Err("must be from 50ms to 60s, got 0s".to_owned())
        );
        assert_eq!(EXPIRATION_MIN_GAP.check(ms(50)), Ok(ms(50)));
    }

    #[test]
    fn every_setting_has_one_range_and_no_range_is_empty() {
        let mut names: Vec<&str> = DURATIONS.iter().map(|r| r.setting).collect();
        names.extend(COUNTS.iter().map(|r| r.setting));
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a setting listed twice");
        assert!(DURATIONS.iter().all(|r| r.min <= r.max));
        assert!(COUNTS.iter().all(|r| r.min <= r.max));
    }
}
