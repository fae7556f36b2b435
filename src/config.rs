//! Typed settings, parsed once at the edge and grouped by the part of the
//! program that uses them.
//!
//! Every setting is a flag or the environment variable of the same name
//! (spec §9), declared once in [`catalog`]: its name, default, range or
//! parser, and line of `--help`. What follows from a declaration (the
//! clap argument, the range check, the text `--help` and the docs show)
//! is [`setting`]'s. A malformed value is one [`ConfigError`] naming the
//! variable, while clap reads the command line; defaults are typed
//! constants ([`defaults`]) that go through the same parsers. The groups
//! below are what their owners receive: the expiry worker gets [`ExpirySettings`],
//! [`EventSettings`] and [`ShutdownSettings`], the publisher
//! [`PublisherSettings`] and [`KafkaSettings`], and so on. `run` gets all of
//! them as one [`Settings`], whose one validation step
//! ([`Settings::from_args`]) checks what spans settings; the other commands
//! take only the groups they use ([`Command`]).

pub mod catalog;
mod cli;
mod database;
mod expiry;
mod http;
mod kafka;
pub mod parse;
mod publisher;
pub(crate) mod secret;
mod seed;
pub mod setting;

use std::time::Duration;

pub use catalog::defaults;
pub use cli::{
    Cli, Command, DatabaseArgs, KafkaArgs, KafkaTlsArgs, LibpqArgs, OutboxCommand, RepublishArgs,
    RepublishBatch, RoleArgs, RunArgs,
};
pub use database::{DatabaseSettings, Pooler};
pub use expiry::{EventSettings, ExpirySettings, ShutdownSettings};
pub use http::HttpSettings;
pub use kafka::{
    Compression, KafkaClientCert, KafkaSettings, KafkaTls, SaslMechanism, SaslSettings,
    SecurityProtocol,
};
pub use publisher::PublisherSettings;
pub use seed::SeedSettings;
use setting::AsText as _;

/// A setting that is missing or malformed, or settings that cannot work
/// together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {problem}")]
pub struct ConfigError {
    /// The environment variable name of the setting (the flag for flags
    /// without one).
    pub setting: String,
    pub problem: String,
}

impl From<crate::libpq::LibpqError> for ConfigError {
    fn from(error: crate::libpq::LibpqError) -> Self {
        Self::new(error.setting, error.problem)
    }
}

impl ConfigError {
    pub fn new(setting: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            setting: setting.into(),
            problem: problem.into(),
        }
    }

    /// The setting error inside a clap error from a setting's value
    /// parser ([`setting::Named`]). `main` prints it as the one line of an exit 2 instead
    /// of clap's text, which spans several lines and quotes the value (a
    /// password, say).
    pub fn from_clap(error: &clap::Error) -> Option<Self> {
        std::error::Error::source(error)?
            .downcast_ref::<Self>()
            .cloned()
    }
}

/// Everything `run` needs, validated, grouped by owner.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub database: DatabaseSettings,
    pub expiry: ExpirySettings,
    pub events: EventSettings,
    pub publisher: PublisherSettings,
    /// `Some` exactly when `roles.publisher`.
    pub kafka: Option<KafkaSettings>,
    pub http: HttpSettings,
    pub shutdown: ShutdownSettings,
    pub roles: Roles,
}

/// Which loops `run` starts (`NO_WORKER`, `NO_PUBLISHER`); at least one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    pub worker: bool,
    pub publisher: bool,
}

/// Time `run` allows, after its tasks' own bounds, for the last commit,
/// the last mark and closing connections.
pub const STOP_MARGIN: Duration = Duration::from_secs(5);

/// The start-up checks of `run` that config cannot make itself: they need
/// the TLS library (the CPU, the certificate and key files), so `db` and
/// `outbox` own them and `app` hands them in. [`Settings::checked_from_args`]
/// runs each as soon as the group it checks is complete, so a bad file is
/// reported in the order of the settings, as when the files were read
/// while parsing.
#[derive(Debug, Clone, Copy)]
pub struct StartupChecks {
    pub database: fn(&DatabaseSettings) -> Result<(), ConfigError>,
    pub kafka: fn(&KafkaSettings) -> Result<(), ConfigError>,
}

impl StartupChecks {
    /// No check: the settings alone (unit tests of the rules).
    pub const NONE: Self = Self {
        database: |_| Ok(()),
        kafka: |_| Ok(()),
    };
}

impl Settings {
    /// The one validation step of `run`: the required settings and every
    /// rule that spans settings. Each value was parsed (and range-checked)
    /// by its value parser already. No start-up check runs: see
    /// [`Self::checked_from_args`].
    pub fn from_args(args: RunArgs) -> Result<Self, ConfigError> {
        Self::checked_from_args(args, StartupChecks::NONE)
    }

    /// [`Self::from_args`] with `checks` run as each group is complete.
    pub fn checked_from_args(args: RunArgs, checks: StartupChecks) -> Result<Self, ConfigError> {
        let database = args.database.settings()?;
        (checks.database)(&database)?;
        let roles = Roles {
            worker: !args.roles.no_worker,
            publisher: !args.roles.no_publisher,
        };
        if !roles.worker && !roles.publisher {
            return Err(ConfigError::new(
                catalog::NO_WORKER.name(),
                format!(
                    "and {} together leave nothing to run",
                    catalog::NO_PUBLISHER.name()
                ),
            ));
        }
        if roles.worker {
            check_liveness_spans_a_tick(&args.http, &args.expiry)?;
        }
        let kafka = if !roles.publisher {
            None
        } else {
            let kafka = args.kafka.settings()?;
            (checks.kafka)(&kafka)?;
            Some(kafka)
        };
        Ok(Self {
            database,
            expiry: args.expiry,
            events: args.events,
            publisher: args.publisher,
            kafka,
            http: args.http,
            shutdown: args.shutdown,
            roles,
        })
    }

    /// How long `run` waits for its tasks after a stop signal before it
    /// aborts them: `SHUTDOWN_GRACE` (the expiry's batch in flight and the
    /// publisher's requests on the way get that long, side by side; no
    /// database transaction waits on Kafka, so no Kafka timeout adds to
    /// it) and [`STOP_MARGIN`] for the last commit and the publisher's last
    /// round.
    pub fn stop_grace(&self) -> Duration {
        self.shutdown.grace + STOP_MARGIN
    }
}

/// `LIVENESS_WINDOW` must be longer than `EXPIRATION_INTERVAL`: an instance
/// with nothing due completes one cycle per tick, and `/healthz` fails
/// when no cycle succeeded within the window, so a shorter window would
/// fail an idle, healthy worker between its ticks (and an orchestrator
/// would restart it again and again).
fn check_liveness_spans_a_tick(
    http: &HttpSettings,
    expiry: &ExpirySettings,
) -> Result<(), ConfigError> {
    if http.liveness_window > expiry.interval {
        return Ok(());
    }
    Err(ConfigError::new(
        catalog::LIVENESS_WINDOW.name(),
        format!(
            "{} must be longer than {} ({}): an idle instance completes a cycle once per \
             tick, so /healthz would fail between ticks",
            http.liveness_window.as_text(),
            catalog::EXPIRATION_INTERVAL.name(),
            expiry.interval.as_text(),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::libpq::DatabaseUrl;

    fn database(statement_timeout: Duration) -> DatabaseSettings {
        DatabaseSettings {
            statement_timeout,
            ..DatabaseSettings::new(DatabaseUrl::parse("postgres://h/db").unwrap())
        }
    }

    #[test]
    fn migrate_and_listen_need_a_session() {
        let url = |raw: &str| DatabaseUrl::parse(raw).unwrap();
        let direct = DatabaseSettings::new(url("postgres://u:p@db/crm"));
        assert_eq!(direct.session().unwrap().url, direct.url);
        assert_eq!(direct.for_migrate().unwrap().url, direct.url);

        let pooled = DatabaseSettings {
            pooler: Pooler::Transaction,
            ..DatabaseSettings::new(url("postgres://u:p@pgbouncer:6432/crm"))
        };
        assert_eq!(pooled.session(), None);
        let error = pooled.for_migrate().unwrap_err();
        assert_eq!(error.setting, "DATABASE_DIRECT_URL");

        let with_direct = DatabaseSettings {
            direct_url: Some(url("postgres://u:p@db:5432/crm")),
            ..pooled
        };
        let session = with_direct.for_migrate().unwrap();
        assert_eq!(session.url, url("postgres://u:p@db:5432/crm"));
        assert_eq!(session.pooler, Pooler::None);
        assert!(session.is_direct, "its errors name DATABASE_DIRECT_URL");
        assert!(!direct.session().unwrap().is_direct);
        assert_eq!(session.statement_timeout, with_direct.statement_timeout);
    }

    fn kafka(request_timeout: Duration) -> KafkaSettings {
        KafkaSettings {
            request_timeout,
            ..KafkaSettings::new(vec!["h:9092".into()])
        }
    }

    #[test]
    fn the_idle_limit_is_twice_the_statement_timeout() {
        assert_eq!(
            database(Duration::from_secs(30)).idle_in_transaction_timeout(),
            Duration::from_secs(60)
        );
    }

    fn settings(kafka: Option<KafkaSettings>) -> Settings {
        Settings {
            database: database(defaults::DATABASE_STATEMENT_TIMEOUT),
            expiry: ExpirySettings::default(),
            events: EventSettings::default(),
            publisher: PublisherSettings::default(),
            roles: Roles {
                worker: true,
                publisher: kafka.is_some(),
            },
            kafka,
            http: HttpSettings::default(),
            shutdown: ShutdownSettings {
                grace: Duration::from_secs(7),
            },
        }
    }

    #[test]
    fn stop_grace_is_the_grace_and_the_margin_whatever_kafka_waits() {
        let with_kafka = settings(Some(kafka(Duration::from_secs(35))));
        assert_eq!(
            with_kafka.stop_grace(),
            Duration::from_secs(7) + STOP_MARGIN
        );
        let worker_only = settings(None);
        assert_eq!(
            worker_only.stop_grace(),
            Duration::from_secs(7) + STOP_MARGIN
        );
    }
}
