//! Every setting of the worker, declared once: its name (the variable; the
//! flag is the same in lower case with `-`), its default, the values it
//! takes (a range, with the reason for each bound, or a parser) and its
//! line of `--help`. The clap arguments, the range checks, `--help` and
//! the typed [`defaults`] all come from these declarations, and
//! docs/configuration.md is checked against them (`tests/docs.rs`).
//!
//! Adding a setting: docs/configuration.md, "Adding a setting".

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    path::PathBuf,
    time::Duration,
};

use clap::builder::ValueParser;

use super::{
    Compression, Pooler, SaslMechanism, SecurityProtocol,
    parse::{self, BootstrapServers},
    secret::{self, Secret},
    setting::{Declared, Setting, by_clap, parsed, switch, within},
};
use crate::libpq::{env, ssl::SslMode, url::PgUrl};

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

/// PostgreSQL takes its timeouts as int milliseconds: at most
/// 2,147,483,647 ms (24.8 days); `SET` refuses more.
pub const POSTGRES_MAX_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// Declares each setting as a constant of its name (a [`Setting`]), its
/// default as a constant of the same name in [`defaults`], and [`ALL`].
///
/// `NAME: Type = default => values, "help";`, or without `= default` for
/// a setting that is unset unless given.
macro_rules! settings {
    ($(
        $(#[$meta:meta])*
        $name:ident: $ty:ty $(= $default:expr)? => $values:expr, $help:literal;
    )*) => {
        /// The typed default of every setting that has one, named as the
        /// setting.
        pub mod defaults {
            #[allow(unused_imports)]
            use super::*;

            $(settings!(@default $name: $ty $(= $default)?);)*
        }

        $(
            $(#[$meta])*
            pub const $name: Setting<$ty> = Setting {
                variable: stringify!($name),
                help: $help,
                default: settings!(@declared $name $(= $default)?),
                ..$values
            };
        )*

        /// Every setting, in the order of the lists above.
        pub const ALL: &[&dyn Declared] = &[$(&$name),*];
    };
    (@default $name:ident: $ty:ty = $default:expr) => {
        #[doc = concat!("The default of [`", stringify!($name), "`](super::", stringify!($name), ").")]
        pub const $name: <$ty as $crate::config::setting::Value>::Const = $default;
    };
    (@default $name:ident: $ty:ty) => {};
    (@declared $name:ident = $default:expr) => {
        Some(defaults::$name)
    };
    (@declared $name:ident) => {
        None
    };
}

settings! {
    // --- DATABASE_*: the database, the pool and its sessions ------------------

    DATABASE_URL: PgUrl => parsed(parse::pg_url).hide_value(),
        "PostgreSQL URL (postgres://user:password@host:port/database)";

    /// Floor: one connection is enough for `once`, `status` and `seed`.
    /// Ceiling: each connection is a server process; PostgreSQL's default
    /// `max_connections` is 100, and a thousand would starve crm.
    DATABASE_POOL_SIZE: u32 = 8 => within(1, 1000),
        "Maximum connections in the pool";

    /// Floor: a TCP, TLS and SCRAM set-up takes about 10 ms on loopback and
    /// tens of ms across a data centre; below 100 ms a sound server would be
    /// reported unreachable. Ceiling: a pooled checkout waits this long too,
    /// so a cycle or a publish batch stalls for up to this long on a dead
    /// server before it says so.
    DATABASE_CONNECT_TIMEOUT: Duration = secs(5) => within(ms(100), minutes(10)),
        "Time to wait for a connection";

    /// Floor: one batch's statements (lock, write, count) take tens of ms,
    /// a few hundred on a loaded server; the same value is the lock
    /// timeout. Ceiling: PostgreSQL's int milliseconds
    /// ([`POSTGRES_MAX_TIMEOUT`], 24.8 days) must hold the
    /// idle-in-transaction limit, which is twice this: 12 days keeps both
    /// within it (12.5 days made every connection's `SET` fail).
    DATABASE_STATEMENT_TIMEOUT: Duration = secs(30) => within(secs(1), days(12)),
        "Server-side limit of one statement (twice that for an idle transaction)";

    /// No pooler, or one in session mode: the worker's sessions are its own.
    DATABASE_POOLER: Pooler = Pooler::None => parsed(parse::pooler),
        "none or transaction: a pooler in transaction mode (PgBouncer pool_mode=transaction) \
         between the worker and PostgreSQL";

    DATABASE_DIRECT_URL: PgUrl => parsed(parse::pg_url).hide_value(),
        "A direct PostgreSQL URL past the pooler, for what needs a session: the commit wake-up \
         (LISTEN) and migrate";

    // --- libpq's variables: each where the URLs leave its parameter out ------

    PGHOST: String => parsed(parse::text),
        "Default host(s) when the URL has none: names, addresses or Unix socket directories, \
         comma-separated (libpq's PGHOST)";
    PGPORT: String => parsed(env::ports),
        "Default port(s) when the URL has none, comma-separated (libpq's PGPORT)";
    PGDATABASE: String => parsed(parse::text),
        "Default database when the URL names none (libpq's PGDATABASE)";
    PGUSER: String => parsed(parse::text),
        "Default user when the URL names none (libpq's PGUSER)";
    PGPASSWORD: Secret => parsed(secret::parse).secret(),
        "Password when the URL has none (libpq's PGPASSWORD; prefer a password file, the \
         environment of a process is easier to read)";
    PGPASSFILE: PathBuf => parsed(parse::path),
        "Password file read when neither the URL nor PGPASSWORD gives a password; default \
         ~/.pgpass (libpq's PGPASSFILE)";
    /// An empty value is unset too, hence a value that may say "none" with
    /// an empty, hidden default.
    PGSSLMODE: Option<SslMode> = None => parsed(env::sslmode).hide_default(),
        "Default sslmode (libpq's PGSSLMODE)";
    PGSSLROOTCERT: String => parsed(parse::text),
        "Default sslrootcert (libpq's PGSSLROOTCERT)";
    PGSSLCERT: String => parsed(parse::text),
        "Default sslcert (libpq's PGSSLCERT)";
    PGSSLKEY: String => parsed(parse::text),
        "Default sslkey (libpq's PGSSLKEY)";
    PGAPPNAME: String => parsed(parse::text),
        "Default application_name (libpq's PGAPPNAME)";
    PGCONNECT_TIMEOUT: String => parsed(env::seconds),
        "Default connect_timeout, whole seconds per host (libpq's PGCONNECT_TIMEOUT); \
         DATABASE_CONNECT_TIMEOUT still bounds the whole connection";

    // --- EXPIRATION_*: the expiry worker's sweep -----------------------------

    /// Floor: the tick starts a cycle (a clock check, a lock query and a
    /// count per phase) even when nothing is due; below 100 ms an idle
    /// instance would do little else (deadline wake-up already wakes just
    /// after each deadline). Ceiling: the tick is what takes rows skipped
    /// because they were locked, retries poison rows and ends clock
    /// trouble; an hour bounds how long they wait. `/healthz` needs a cycle
    /// within `LIVENESS_WINDOW`, so `run` also wants that longer than this.
    EXPIRATION_INTERVAL: Duration = secs(60) => within(ms(100), hours(1)),
        "Cycle period (humantime: 500ms, 1s, 60s)";

    /// Ceiling: one transaction holds the row locks of the whole batch until
    /// it commits, and crm's commands on those bookings wait for it.
    EXPIRATION_BATCH_SIZE: u32 = 200 => within(1, 100_000),
        "Rows per phase per transaction";

    /// Floor: one batch per cycle (the draft's literal schedule). Ceiling:
    /// `EXPIRATION_CYCLE_BUDGET` bounds a cycle's time; this bounds its work.
    EXPIRATION_MAX_BATCHES_PER_CYCLE: u32 = 1000 => within(1, 1_000_000),
        "Batches per phase per cycle while batches come back full (1 = one batch per cycle)";

    /// Floor: a cycle always runs one batch per phase; a budget shorter than
    /// a batch (tens of ms) would cut every cycle there. Ceiling: no other
    /// cycle starts while one runs, so bookings falling due meanwhile wait
    /// up to this long.
    EXPIRATION_CYCLE_BUDGET: Duration = secs(30) => within(ms(100), hours(1)),
        "No new batch starts after a cycle ran this long (the first batch of each phase always \
         runs)";

    /// Floor: 0 lets `as_of` run no further than the database clock.
    /// Ceiling: the check exists so a fast clock cannot expire bookings
    /// early; allowing more than an hour is no check (`off` turns it off,
    /// said plainly).
    EXPIRATION_MAX_CLOCK_SKEW: Option<Duration> = Some(secs(2))
        => within(Some(secs(0)), Some(hours(1))),
        "as_of never runs ahead of the database clock by more than this (\"off\" disables the \
         check)";

    EXPIRATION_DEADLINE_WAKE: bool = true => parsed(parse::switch),
        "Also wake just after the next known deadline, not only on the interval (\"false\": the \
         fixed schedule alone)";

    /// Default: the lateness it allows, bookings whose deadlines lie close
    /// together expiring up to this long after them, stays under the
    /// 100 ms promise with a cycle's time on top; one instance at a time
    /// (the waker) wakes at deadlines, so this bounds the deadline cycles
    /// of all instances together, not of each.
    /// Floor: at most 20 cycles a second. Each cycle costs a clock check,
    /// a lock query per phase and a commit (a few ms of database time), so
    /// however the deadlines fall the waker stays a small load; at 0 a
    /// clock out of skew ran a cycle every 5 ms.
    /// Ceiling: past a minute, the fixed schedule
    /// (`EXPIRATION_DEADLINE_WAKE=false`) says it better.
    EXPIRATION_MIN_GAP: Duration = ms(50) => within(ms(50), minutes(1)),
        "No cycle starts sooner than this after the previous one ended, so deadlines close \
         together share one cycle";

    /// Floor: 0 rolls the batch in flight back at once. Ceiling: the
    /// orchestrator must wait `SHUTDOWN_GRACE` + 5 s (Kubernetes'
    /// `terminationGracePeriodSeconds`, 40 s in deploy/); a batch is
    /// bounded by `DATABASE_STATEMENT_TIMEOUT` anyway.
    SHUTDOWN_GRACE: Duration = secs(10) => within(secs(0), minutes(10)),
        "On shutdown, how long an in-flight batch may take before it is rolled back";

    // --- what the events carry ------------------------------------------------

    /// The `ce_source` header of the events.
    CE_SOURCE: String = "/pin/crm/booking-expiration" => by_clap(ValueParser::string),
        "`ce_source` header of the events";

    /// The contract's topic, as the consumers' crate names it.
    KAFKA_TOPIC: String = booking_expired_proto::TOPIC => parsed(parse::topic),
        "Topic written on outbox rows";

    // --- KAFKA_*: the publisher's connection to the brokers -------------------

    KAFKA_BOOTSTRAP_SERVERS: BootstrapServers => parsed(parse::bootstrap_servers),
        "Comma-separated host:port list";

    KAFKA_CLIENT_ID: String = "booking-expiration" => by_clap(ValueParser::string),
        "Client id sent to the broker";

    /// Floor: a produce with `acks=all` takes a few ms on a healthy
    /// cluster; below 100 ms every produce would time out. Ceiling: a
    /// silent broker holds its partitions' rows this long before they are
    /// sent again.
    KAFKA_REQUEST_TIMEOUT: Duration = secs(35) => within(ms(100), minutes(10)),
        "Limit of one metadata read or one partition's produce request";

    KAFKA_CREATE_TOPIC: bool = false => switch(),
        "Create the topic when it does not exist (otherwise a missing topic is an error)";

    /// Ceiling: Kafka's own guidance for partitions per broker.
    KAFKA_TOPIC_PARTITIONS: i32 = 3 => within(1, 10_000),
        "Partitions of a topic created by KAFKA_CREATE_TOPIC";

    /// Ceiling: no more replicas than any cluster has brokers in practice.
    KAFKA_REPLICATION_FACTOR: i16 = 1 => within(1, 32),
        "Replication factor of a topic created by KAFKA_CREATE_TOPIC";

    KAFKA_COMPRESSION: Compression = Compression::None => parsed(parse::compression),
        "none, gzip or snappy (lz4/zstd with their opt-in features)";

    /// An empty value also means no SASL, hence a value that may say "none"
    /// with an empty, hidden default.
    KAFKA_SASL_MECHANISM: Option<SaslMechanism> = None
        => parsed(parse::sasl_mechanism).hide_default(),
        "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; unset = no SASL";

    KAFKA_SASL_USERNAME: String => by_clap(ValueParser::string), "";

    KAFKA_SASL_PASSWORD: Secret => parsed(secret::parse).secret(), "";

    /// Unset: `SASL_PLAINTEXT` with a SASL mechanism, `PLAINTEXT` without
    /// (`KafkaArgs::settings`).
    KAFKA_SECURITY_PROTOCOL: Option<SecurityProtocol> = None
        => parsed(parse::security_protocol).hide_default(),
        "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (any case); unset = SASL_PLAINTEXT with a \
         SASL mechanism, PLAINTEXT without";

    KAFKA_SSL_CA_LOCATION: PathBuf => by_clap(ValueParser::path_buf),
        "PEM bundle of the CAs trusted for the brokers; unset = the bundled webpki (Mozilla) \
         roots";
    KAFKA_SSL_CERTIFICATE_LOCATION: PathBuf => by_clap(ValueParser::path_buf),
        "PEM client certificate (chain) for mutual TLS; needs KAFKA_SSL_KEY_LOCATION";
    KAFKA_SSL_KEY_LOCATION: PathBuf => by_clap(ValueParser::path_buf),
        "PEM unencrypted private key of KAFKA_SSL_CERTIFICATE_LOCATION";

    // --- OUTBOX_*: the publisher's claim, wake-up and retention ---------------

    /// Ceiling: one produce request carries the batch; 10,000 events of
    /// about 300 bytes are 3 MB, past the brokers' default
    /// `message.max.bytes`.
    OUTBOX_BATCH_SIZE: u32 = 500 => within(1, 10_000),
        "Most records in one produce request and rows in one claim";

    /// Floor: each poll is a claim query; 10 ms is 100 a second per
    /// instance. Ceiling: without a commit wake-up (a transaction pooler
    /// and no `DATABASE_DIRECT_URL`) rows wait up to this long before they
    /// are published.
    OUTBOX_POLL_INTERVAL: Duration = secs(1) => within(ms(10), minutes(10)),
        "Polling period when no commit notification arrives";

    /// Floor: 0 deletes rows right after publishing. Ceiling: published
    /// rows are kept for inspection only; `republish` rebuilds any event
    /// from the audit trail, so a year is more than any need, and the
    /// table grows with every day kept.
    OUTBOX_RETENTION: Duration = hours(24) => within(secs(0), days(365)),
        "How long published rows are kept (0s = delete right after publishing)";

    // --- the HTTP endpoints ----------------------------------------------------

    METRICS_ADDR: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 9464))
        => parsed(parse::socket_addr),
        "HTTP address for /metrics, /healthz and /readyz";

    /// Floor: a second; `run` also wants it longer than
    /// `EXPIRATION_INTERVAL`, since an idle instance completes a cycle once
    /// per tick. Ceiling: a worker stuck for a day must fail its liveness
    /// probe.
    LIVENESS_WINDOW: Duration = minutes(5) => within(secs(1), days(1)),
        "/healthz fails when no cycle succeeded for this long (run: longer than \
         EXPIRATION_INTERVAL)";

    // --- which loops `run` starts ------------------------------------------------

    NO_WORKER: bool = false => switch(),
        "Run the publisher only (no expiry cycles)";
    NO_PUBLISHER: bool = false => switch(),
        "Run the expiry worker only (outbox rows wait for another instance)";

    // --- `republish` -------------------------------------------------------------

    /// Outbox rows per transaction, as `OUTBOX_BATCH_SIZE`.
    REPUBLISH_BATCH_SIZE: u32 = 500 => within(1, 10_000).flag("--batch-size"),
        "Expiry records per transaction";

    // --- `seed` --------------------------------------------------------------------

    /// A hundred million rows is about 30 GB, past any demo or load test.
    SEED_ACTIVE: u64 = 10_000 => within(0, 100_000_000).flag("--active"),
        "Active bookings (Reserved, AwaitingPayment and Booked in turn)";
    SEED_DUE_FRACTION: f64 = 0.2 => parsed(parse::fraction).flag("--due-fraction"),
        "Share of the active bookings already due (0.0-1.0)";
    /// As `--active`.
    SEED_INACTIVE: u64 = 0 => within(0, 100_000_000).flag("--inactive"),
        "Terminal or inactive rows beside them";
    /// As `--active`.
    SEED_POISON: u64 = 0 => within(0, 100_000_000).flag("--poison"),
        "Due legacy rows without deal_id (poison)";
    /// Deadlines up to a year ahead.
    SEED_SPREAD: Duration = minutes(10) => within(secs(0), days(365)).flag("--spread"),
        "The not-yet-due deadlines are spread over this span from now";
}

#[cfg(test)]
mod tests {
    use super::{
        super::setting::{AsText, Bounds},
        *,
    };

    #[test]
    fn counts_keep_their_range() {
        let batch = EXPIRATION_BATCH_SIZE;
        assert_eq!(batch.parse("200"), Ok(200));
        assert_eq!(batch.parse(" 100000 "), Ok(100_000));
        for (bad, problem) in [
            ("0", "must be from 1 to 100000, got 0"),
            ("-5", "must be from 1 to 100000, got -5"),
            ("100001", "must be from 1 to 100000, got 100001"),
            (
                "100000000000000000000000000",
                "must be from 1 to 100000, got 100000000000000000000000000",
            ),
            (
                "abc",
                "must be a whole number from 1 to 100000, got \"abc\"",
            ),
            ("", "must be a whole number from 1 to 100000, got \"\""),
            (
                "1.5",
                "must be a whole number from 1 to 100000, got \"1.5\"",
            ),
        ] {
            assert_eq!(batch.parse(bad), Err(problem.to_owned()), "{bad}");
        }
        let replicas = KAFKA_REPLICATION_FACTOR;
        assert_eq!(replicas.parse("32"), Ok(32_i16));
        let seed = SEED_POISON;
        assert_eq!(seed.parse("0"), Ok(0));
    }

    #[test]
    fn durations_keep_their_range() {
        let gap = EXPIRATION_MIN_GAP;
        assert_eq!(gap.parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(gap.parse(" 1m "), Ok(Duration::from_secs(60)));
        for (bad, problem) in [
            ("0", "must be from 50ms to 60s, got 0s"),
            ("49ms", "must be from 50ms to 60s, got 49ms"),
            ("10000000d", "must be from 50ms to 60s, got 10000000d"),
            (
                "soon",
                "must be a duration from 50ms to 60s (like 500ms, 1s or 60s), got \"soon\"",
            ),
            (
                "-1s",
                "must be a duration from 50ms to 60s (like 500ms, 1s or 60s), got \"-1s\"",
            ),
            (
                "18446744073709551616s",
                "must be a duration from 50ms to 60s (like 500ms, 1s or 60s), \
                 got \"18446744073709551616s\"",
            ),
        ] {
            assert_eq!(gap.parse(bad), Err(problem.to_owned()), "{bad}");
        }
        let skew = EXPIRATION_MAX_CLOCK_SKEW;
        assert_eq!(skew.parse(" off "), Ok(None));
        assert_eq!(skew.parse("2s"), Ok(Some(Duration::from_secs(2))));
        assert_eq!(skew.parse("0s"), Ok(Some(Duration::ZERO)));
        assert_eq!(
            skew.parse("10000000d"),
            Err("must be from 0s to 1h, got 10000000d (or off)".to_owned())
        );
        assert_eq!(
            skew.parse("never"),
            Err(
                "must be off or a duration from 0s to 1h (like 500ms, 1s or 60s), got \"never\""
                    .to_owned()
            )
        );
    }

    #[test]
    fn the_statement_timeout_and_its_double_fit_postgres_int_milliseconds() {
        let range = DATABASE_STATEMENT_TIMEOUT.range().expect("a range");
        assert!(range.max * 2 <= POSTGRES_MAX_TIMEOUT);
        // The 12.5 days is out.
        assert!(!range.contains(&hours(12 * 24 + 12)));
    }

    #[test]
    fn ranges_and_defaults_read_as_the_documentation_writes_them() {
        let ranges = [
            (&EXPIRATION_INTERVAL, "100ms to 1h"),
            (&DATABASE_STATEMENT_TIMEOUT, "1s to 12d"),
            (&LIVENESS_WINDOW, "1s to 24h"),
        ];
        for (setting, text) in ranges {
            assert_eq!(setting.range_text().as_deref(), Some(text));
        }
        assert_eq!(
            EXPIRATION_MAX_CLOCK_SKEW.range_text().as_deref(),
            Some("0s to 1h")
        );
        assert_eq!(
            EXPIRATION_BATCH_SIZE.range_text().as_deref(),
            Some("1 to 100000")
        );
        let texts = [
            (EXPIRATION_INTERVAL.default_text(), "60s"),
            (EXPIRATION_MAX_CLOCK_SKEW.default_text(), "2s"),
            (EXPIRATION_DEADLINE_WAKE.default_text(), "true"),
            (EXPIRATION_MIN_GAP.default_text(), "50ms"),
            (OUTBOX_RETENTION.default_text(), "24h"),
            (LIVENESS_WINDOW.default_text(), "5m"),
            (METRICS_ADDR.default_text(), "127.0.0.1:9464"),
            (KAFKA_COMPRESSION.default_text(), "none"),
            (DATABASE_POOLER.default_text(), "none"),
            (SEED_DUE_FRACTION.default_text(), "0.2"),
            (KAFKA_CLIENT_ID.default_text(), "booking-expiration"),
        ];
        for (text, documented) in texts {
            assert_eq!(text.as_deref(), Some(documented));
        }
        for (text, documented) in [
            (None::<Duration>.as_text(), "off"),
            (ms(500).as_text(), "500ms"),
            (Duration::ZERO.as_text(), "0s"),
            (days(1).as_text(), "24h"),
            (days(12).as_text(), "12d"),
        ] {
            assert_eq!(text, documented);
        }
        // Unset, or an empty default that means unset: none shown.
        assert_eq!(DATABASE_URL.default_text(), None);
        assert_eq!(KAFKA_SASL_MECHANISM.default_text(), None);
    }

    /// Each setting is declared once: one name each, every range the
    /// right way round, a default read back by its own parser as itself.
    /// (Every default goes through its parser and range whenever clap
    /// reads a command line: `cli`'s tests.)
    #[test]
    fn every_setting_is_declared_once_and_its_default_is_a_value_it_takes() {
        let mut names: Vec<&str> = ALL.iter().map(|setting| setting.name()).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a setting declared twice");
        assert!(count > 50, "{count} settings");
        for setting in ALL {
            if let Some(bounds) = setting.bounds() {
                match bounds {
                    Bounds::Duration { min, max, .. } => assert!(min <= max),
                    Bounds::Count { min, max } => assert!(min <= max),
                }
            }
        }
        assert_eq!(
            KAFKA_REQUEST_TIMEOUT.parse(&defaults::KAFKA_REQUEST_TIMEOUT.as_text()),
            Ok(defaults::KAFKA_REQUEST_TIMEOUT)
        );
        assert_eq!(
            EXPIRATION_MAX_CLOCK_SKEW.parse("2s"),
            Ok(defaults::EXPIRATION_MAX_CLOCK_SKEW)
        );
    }
}
