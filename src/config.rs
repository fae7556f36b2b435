//! Typed settings, parsed once at the edge and grouped by the part of the
//! program that uses them.
//!
//! Every setting is a flag or the environment variable of the same name
//! (spec §9). Its value parser ([`parse`]) turns the text into its type
//! while clap reads the command line, so a malformed value is one
//! [`ConfigError`] naming the variable; defaults are typed constants
//! ([`defaults`]) that go through the same parsers. The groups below are
//! what their owners receive: the expiry worker gets [`ExpirySettings`],
//! [`EventSettings`] and [`ShutdownSettings`], the publisher
//! [`PublisherSettings`] and [`KafkaSettings`], and so on. `run` gets all of
//! them as one [`Settings`], whose one validation step
//! ([`Settings::from_args`]) checks what spans settings; the other commands
//! take only the groups they use ([`Command`]).
//!
//! Each argument's id is its variable name: ids stay unique across the
//! flattened groups, and `--help` shows `--expiration-interval
//! <EXPIRATION_INTERVAL>`.

mod cli;
pub mod defaults;
pub mod parse;
pub mod pg_tls;
pub mod pg_url;
pub mod secret;

use std::{fmt, net::SocketAddr, path::PathBuf, time::Duration};

use clap::Args;

pub use cli::{
    Cli, Command, DatabaseArgs, KafkaArgs, KafkaTlsArgs, OutboxCommand, RepublishArgs, RunArgs,
};
use defaults::{AsText as _, text};
use parse::setting;

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

impl ConfigError {
    pub fn new(setting: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            setting: setting.into(),
            problem: problem.into(),
        }
    }

    /// The setting error inside a clap error from a [`parse::setting`]
    /// value parser. `main` prints it as the one line of an exit 2 instead
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

impl Settings {
    /// The one validation step of `run`: the required settings and every
    /// rule that spans settings. Each value was parsed (and range-checked)
    /// by its value parser already.
    pub fn from_args(args: RunArgs) -> Result<Self, ConfigError> {
        let database = args.database.settings()?;
        if args.no_worker && args.no_publisher {
            return Err(ConfigError::new(
                "NO_WORKER",
                "and NO_PUBLISHER together leave nothing to run",
            ));
        }
        let kafka = if args.no_publisher {
            None
        } else {
            let kafka = kafka_settings(args.kafka)?;
            check_kafka_fits_idle_transaction(&database, &kafka)?;
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
            roles: Roles {
                worker: !args.no_worker,
                publisher: !args.no_publisher,
            },
        })
    }

    /// How long `run` waits for its tasks after a stop signal before it
    /// aborts them: the grace an in-flight expiry batch gets
    /// (`SHUTDOWN_GRACE`), one `KAFKA_REQUEST_TIMEOUT` for a produce in
    /// flight (it bounds the whole produce: connect, metadata, leader
    /// lookup and produce), and [`STOP_MARGIN`].
    pub fn stop_grace(&self) -> Duration {
        self.shutdown.grace
            + self
                .kafka
                .as_ref()
                .map_or(Duration::ZERO, |kafka| kafka.request_timeout)
            + STOP_MARGIN
    }
}

/// `KAFKA_REQUEST_TIMEOUT` must be at most `DATABASE_STATEMENT_TIMEOUT`.
///
/// A publish transaction sits idle while its batch is on the way to Kafka,
/// for up to one `KAFKA_REQUEST_TIMEOUT`, and the server ends a transaction
/// idle for longer than [`DatabaseSettings::idle_in_transaction_timeout`]
/// (twice `DATABASE_STATEMENT_TIMEOUT`): the batch would be rolled back
/// after Kafka took it, and republished. The rule keeps the produce within
/// half that limit; the other half is margin for a timeout that fires late
/// on a busy runtime and for the mark that follows it.
fn check_kafka_fits_idle_transaction(
    database: &DatabaseSettings,
    kafka: &KafkaSettings,
) -> Result<(), ConfigError> {
    let limit = database.idle_in_transaction_timeout() / 2;
    if kafka.request_timeout <= limit {
        return Ok(());
    }
    Err(ConfigError::new(
        "KAFKA_REQUEST_TIMEOUT",
        format!(
            "{} must be at most DATABASE_STATEMENT_TIMEOUT ({}): a publish transaction \
             waits idle for Kafka and PostgreSQL ends it after twice DATABASE_STATEMENT_TIMEOUT",
            kafka.request_timeout.as_text(),
            database.statement_timeout.as_text(),
        ),
    ))
}

/// Builds the Kafka group: the servers are required for the publisher,
/// and a SASL mechanism needs its username and password.
fn kafka_settings(args: KafkaArgs) -> Result<KafkaSettings, ConfigError> {
    let protocol = security_protocol(&args)?;
    let bootstrap_servers = args
        .kafka_bootstrap_servers
        .ok_or_else(|| {
            ConfigError::new(
                "KAFKA_BOOTSTRAP_SERVERS",
                "is required for run (host:port,host:port)",
            )
        })?
        .0;
    let sasl = match args.kafka_sasl_mechanism {
        None => None,
        Some(mechanism) => Some(SaslSettings {
            mechanism,
            username: args.kafka_sasl_username.ok_or_else(|| {
                ConfigError::new(
                    "KAFKA_SASL_USERNAME",
                    "is required with KAFKA_SASL_MECHANISM",
                )
            })?,
            password: args
                .kafka_sasl_password
                .map(secret::Secret::into_inner)
                .ok_or_else(|| {
                    ConfigError::new(
                        "KAFKA_SASL_PASSWORD",
                        "is required with KAFKA_SASL_MECHANISM",
                    )
                })?,
        }),
    };
    let tls = kafka_tls(&args.tls, protocol)?;
    Ok(KafkaSettings {
        bootstrap_servers,
        client_id: args.kafka_client_id,
        request_timeout: args.kafka_request_timeout,
        create_topic: args.kafka_create_topic,
        topic_partitions: args.kafka_topic_partitions,
        replication_factor: args.kafka_replication_factor,
        compression: args.kafka_compression,
        sasl,
        tls,
    })
}

/// `KAFKA_SECURITY_PROTOCOL`, checked against `KAFKA_SASL_MECHANISM`.
///
/// Unset, it is `SASL_PLAINTEXT` when a SASL mechanism is given (as
/// before the setting existed) and [`defaults::KAFKA_SECURITY_PROTOCOL`]
/// otherwise. Set, it must agree with the mechanism: librdkafka silently
/// ignores a mechanism under `PLAINTEXT` or `SSL`, which hides a
/// misconfiguration, so here that is an error.
fn security_protocol(args: &KafkaArgs) -> Result<SecurityProtocol, ConfigError> {
    let mechanism = args.kafka_sasl_mechanism;
    let Some(protocol) = args.kafka_security_protocol else {
        return Ok(if mechanism.is_some() {
            SecurityProtocol::SaslPlaintext
        } else {
            defaults::KAFKA_SECURITY_PROTOCOL
        });
    };
    match (protocol.sasl(), mechanism) {
        (true, None) => Err(ConfigError::new(
            "KAFKA_SASL_MECHANISM",
            format!("is required with KAFKA_SECURITY_PROTOCOL={protocol}"),
        )),
        (false, Some(_)) => Err(ConfigError::new(
            "KAFKA_SASL_MECHANISM",
            format!(
                "is set, but KAFKA_SECURITY_PROTOCOL={protocol} uses no SASL \
                 (use SASL_SSL or SASL_PLAINTEXT, or unset KAFKA_SASL_MECHANISM)"
            ),
        )),
        _ => Ok(protocol),
    }
}

/// The TLS settings of `SSL` and `SASL_SSL`. The files are checked at
/// start by `outbox::kafka_tls::check` (and read again for every
/// connection).
fn kafka_tls(
    args: &KafkaTlsArgs,
    protocol: SecurityProtocol,
) -> Result<Option<KafkaTls>, ConfigError> {
    if !protocol.tls() {
        let given = [
            ("KAFKA_SSL_CA_LOCATION", &args.kafka_ssl_ca_location),
            (
                "KAFKA_SSL_CERTIFICATE_LOCATION",
                &args.kafka_ssl_certificate_location,
            ),
            ("KAFKA_SSL_KEY_LOCATION", &args.kafka_ssl_key_location),
        ];
        if let Some((setting, _)) = given.iter().find(|(_, value)| value.is_some()) {
            return Err(ConfigError::new(
                *setting,
                format!(
                    "is set, but KAFKA_SECURITY_PROTOCOL={protocol} uses no TLS \
                     (use SSL or SASL_SSL)"
                ),
            ));
        }
        return Ok(None);
    }
    let client = match (
        &args.kafka_ssl_certificate_location,
        &args.kafka_ssl_key_location,
    ) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some(KafkaClientCert {
            cert: cert.clone(),
            key: key.clone(),
        }),
        (Some(_), None) => {
            return Err(ConfigError::new(
                "KAFKA_SSL_KEY_LOCATION",
                "is required with KAFKA_SSL_CERTIFICATE_LOCATION",
            ));
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                "KAFKA_SSL_CERTIFICATE_LOCATION",
                "is required with KAFKA_SSL_KEY_LOCATION",
            ));
        }
    };
    let tls = KafkaTls {
        ca: args.kafka_ssl_ca_location.clone(),
        client,
    };
    Ok(Some(tls))
}

/// A PostgreSQL URL that never prints its password: parsed once, the way
/// libpq parses it ([`pg_url`]), into the configuration tokio-postgres
/// connects with and libpq's TLS parameters ([`pg_tls`]).
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    url: pg_url::PgUrl,
    /// What tokio-postgres connects with: the parts of `url`, libpq's TLS
    /// parameters left out (`db::tls` adds them).
    config: tokio_postgres::Config,
    tls: pg_tls::PgTls,
}

impl DatabaseUrl {
    /// Parses the URL and its TLS parameters. The certificate and key files
    /// they name are checked at start by `db::tls::check` (a bad file
    /// exits 2 as a bad setting does).
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        const SETTING: &str = "DATABASE_URL";
        let url =
            pg_url::PgUrl::parse(raw).map_err(|e| ConfigError::new(SETTING, e.to_string()))?;
        let tls =
            pg_tls::from_params(&url).map_err(|problem| ConfigError::new(SETTING, problem))?;
        let config = tokio_config(&url).map_err(|problem| ConfigError::new(SETTING, problem))?;
        Ok(Self { url, config, tls })
    }

    /// The configuration tokio-postgres connects with (password included,
    /// libpq's TLS parameters left out; its `Debug` hides the password).
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// Whether the URL asks for a writable server
    /// (`target_session_attrs=read-write`).
    pub fn wants_read_write(&self) -> bool {
        self.config.get_target_session_attrs()
            == tokio_postgres::config::TargetSessionAttrs::ReadWrite
    }

    /// The TLS settings of the URL.
    pub fn tls(&self) -> &pg_tls::PgTls {
        &self.tls
    }

    /// The URL with the password replaced, for logs, rebuilt from the
    /// parsed parts ([`pg_url::PgUrl::redacted`]).
    pub fn redacted(&self) -> String {
        self.url.redacted()
    }
}

/// The tokio-postgres configuration of a parsed URL: the parts and the
/// parameters but libpq's TLS ones, given to tokio-postgres as a key=value
/// string of quoted values (its parser applies each parameter as libpq
/// would), and the password set apart (it never goes into a string).
/// A `host` or `port` parameter replaces the authority's, as in libpq.
fn tokio_config(url: &pg_url::PgUrl) -> Result<tokio_postgres::Config, String> {
    fn quoted(value: &str) -> String {
        format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
    }
    let mut pairs: Vec<(&str, String)> = Vec::new();
    let has = |key: &str| url.params.iter().any(|(k, _)| k == key);
    if !url.hosts.is_empty() && !has("host") {
        let names: Vec<&str> = url.hosts.iter().map(|h| h.name.as_str()).collect();
        pairs.push(("host", names.join(",")));
    }
    if url.hosts.iter().any(|h| h.port.is_some()) && !has("port") {
        let ports: Vec<String> = url
            .hosts
            .iter()
            .map(|h| h.port.map_or_else(String::new, |p| p.to_string()))
            .collect();
        pairs.push(("port", ports.join(",")));
    }
    if let Some(user) = url.user() {
        pairs.push(("user", user.to_owned()));
    }
    if let Some(dbname) = url.dbname() {
        pairs.push(("dbname", dbname.to_owned()));
    }
    for (key, value) in &url.params {
        let pg_url::Value::Text(value) = value else {
            continue;
        };
        if pg_tls::TLS_PARAMETERS.contains(&key.as_str())
            || matches!(key.as_str(), "user" | "dbname")
        {
            continue;
        }
        pairs.push((key, value.clone()));
    }
    let text: Vec<String> = pairs
        .iter()
        .map(|(key, value)| format!("{key}={}", quoted(value)))
        .collect();
    // tokio-postgres's errors name the option, never its value.
    let mut config = text
        .join(" ")
        .parse::<tokio_postgres::Config>()
        .map_err(|e| {
            let cause =
                std::error::Error::source(&e).map_or_else(String::new, |c| format!(" ({c})"));
            format!("{e}{cause}")
        })?;
    if let Some(password) = url.password() {
        config.password(password.expose());
    }
    let no_host = |host: &tokio_postgres::config::Host| match host {
        tokio_postgres::config::Host::Tcp(name) => name.is_empty(),
        tokio_postgres::config::Host::Unix(_) => false,
    };
    if config.get_hosts().is_empty() || config.get_hosts().iter().any(no_host) {
        return Err("has no host".to_owned());
    }
    Ok(config)
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// What sits between the worker and PostgreSQL (`DATABASE_POOLER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooler {
    /// Nothing, or a pooler in session mode: a connection is one session.
    None,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`):
    /// a server session is the worker's only during a transaction. Named
    /// prepared statements, session `SET`s and LISTEN do not survive it.
    Transaction,
}

impl fmt::Display for Pooler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Pooler::None => "none",
            Pooler::Transaction => "transaction",
        })
    }
}

/// The pool and the session limits of every connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseSettings {
    pub url: DatabaseUrl,
    pub pool_size: u32,
    pub connect_timeout: Duration,
    pub statement_timeout: Duration,
    /// The pooler in front of `url`, if any.
    pub pooler: Pooler,
    /// A direct (session) connection past the pooler
    /// (`DATABASE_DIRECT_URL`): the commit wake-up's LISTEN and `migrate`.
    pub direct_url: Option<DatabaseUrl>,
    /// `url` is `DATABASE_DIRECT_URL` (errors name that setting).
    pub is_direct: bool,
}

impl DatabaseSettings {
    /// Settings for `url` alone: no pooler, no direct URL, the default limits.
    pub fn new(url: DatabaseUrl) -> Self {
        Self {
            url,
            pool_size: defaults::DATABASE_POOL_SIZE,
            connect_timeout: defaults::DATABASE_CONNECT_TIMEOUT,
            statement_timeout: defaults::DATABASE_STATEMENT_TIMEOUT,
            pooler: defaults::DATABASE_POOLER,
            direct_url: None,
            is_direct: false,
        }
    }

    /// The same limits on the direct connection: `DATABASE_DIRECT_URL` when
    /// given, else `DATABASE_URL` unless that is a transaction pooler,
    /// which cannot keep a session (then `None`).
    pub fn session(&self) -> Option<DatabaseSettings> {
        let (url, is_direct) = match (&self.direct_url, self.pooler) {
            (Some(direct), _) => (direct.clone(), true),
            (None, Pooler::None) => (self.url.clone(), self.is_direct),
            (None, Pooler::Transaction) => return None,
        };
        Some(DatabaseSettings {
            url,
            pooler: Pooler::None,
            direct_url: None,
            is_direct,
            ..self.clone()
        })
    }

    /// The settings `migrate` connects with: a session is needed (an
    /// advisory lock serialises concurrent runs), so through a transaction
    /// pooler `DATABASE_DIRECT_URL` is required.
    pub fn for_migrate(&self) -> Result<DatabaseSettings, ConfigError> {
        self.session().ok_or_else(|| {
            ConfigError::new(
                "DATABASE_DIRECT_URL",
                "is required by migrate when DATABASE_POOLER=transaction: migrations need a \
                 session, which a transaction pooler does not keep (give a URL that bypasses it)",
            )
        })
    }

    /// The server ends a transaction idle for longer than this (set on
    /// every session): twice the statement timeout.
    pub fn idle_in_transaction_timeout(&self) -> Duration {
        self.statement_timeout * 2
    }
}

/// The expiry worker's sweep.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ExpirySettings {
    /// Cycle period (humantime: 500ms, 1s, 60s).
    #[arg(id = "EXPIRATION_INTERVAL", long = "expiration-interval", env = "EXPIRATION_INTERVAL",
          default_value = text!(defaults::EXPIRATION_INTERVAL), value_parser = setting(parse::positive_duration))]
    pub interval: Duration,
    /// Rows per phase per transaction.
    #[arg(id = "EXPIRATION_BATCH_SIZE", long = "expiration-batch-size", env = "EXPIRATION_BATCH_SIZE",
          default_value = text!(defaults::EXPIRATION_BATCH_SIZE),
          value_parser = setting(parse::count::<u32, { parse::MAX_EXPIRATION_BATCH_SIZE }>))]
    pub batch_size: u32,
    /// Batches per phase per cycle while batches come back full (1 = one batch per cycle).
    #[arg(id = "EXPIRATION_MAX_BATCHES_PER_CYCLE", long = "expiration-max-batches-per-cycle",
          env = "EXPIRATION_MAX_BATCHES_PER_CYCLE", default_value = text!(defaults::EXPIRATION_MAX_BATCHES_PER_CYCLE),
          value_parser = setting(parse::count::<u32, { parse::MAX_BATCHES_PER_CYCLE }>))]
    pub max_batches_per_cycle: u32,
    /// No new batch starts after a cycle ran this long.
    #[arg(id = "EXPIRATION_CYCLE_BUDGET", long = "expiration-cycle-budget", env = "EXPIRATION_CYCLE_BUDGET",
          default_value = text!(defaults::EXPIRATION_CYCLE_BUDGET), value_parser = setting(parse::positive_duration))]
    pub cycle_budget: Duration,
    /// as_of never runs ahead of the database clock by more than this ("off" disables the check).
    // `std::option::Option`: one value that may say "none", not an optional flag.
    #[arg(id = "EXPIRATION_MAX_CLOCK_SKEW", long = "expiration-max-clock-skew", env = "EXPIRATION_MAX_CLOCK_SKEW",
          default_value = text!(defaults::EXPIRATION_MAX_CLOCK_SKEW), value_parser = setting(parse::clock_skew))]
    pub max_clock_skew: std::option::Option<Duration>,
    /// Also wake just after the next known deadline, not only on the
    /// interval ("false": the fixed schedule alone).
    #[arg(id = "EXPIRATION_DEADLINE_WAKE", long = "expiration-deadline-wake", env = "EXPIRATION_DEADLINE_WAKE",
          default_value = text!(defaults::EXPIRATION_DEADLINE_WAKE), value_parser = setting(parse::switch),
          action = clap::ArgAction::Set)]
    pub deadline_wake: bool,
    /// No cycle starts sooner than this after the previous one ended, so
    /// deadlines close together share one cycle.
    #[arg(id = "EXPIRATION_MIN_GAP", long = "expiration-min-gap", env = "EXPIRATION_MIN_GAP",
          default_value = text!(defaults::EXPIRATION_MIN_GAP), value_parser = setting(parse::duration))]
    pub min_gap: Duration,
}

impl Default for ExpirySettings {
    fn default() -> Self {
        Self {
            interval: defaults::EXPIRATION_INTERVAL,
            batch_size: defaults::EXPIRATION_BATCH_SIZE,
            max_batches_per_cycle: defaults::EXPIRATION_MAX_BATCHES_PER_CYCLE,
            cycle_budget: defaults::EXPIRATION_CYCLE_BUDGET,
            max_clock_skew: defaults::EXPIRATION_MAX_CLOCK_SKEW,
            deadline_wake: defaults::EXPIRATION_DEADLINE_WAKE,
            min_gap: defaults::EXPIRATION_MIN_GAP,
        }
    }
}

/// What the events carry: the topic written on each outbox row and the
/// `ce_source` header.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct EventSettings {
    /// `ce_source` header of the events.
    #[arg(id = "CE_SOURCE", long = "ce-source", env = "CE_SOURCE", default_value = defaults::CE_SOURCE)]
    pub ce_source: String,
    /// Topic written on outbox rows.
    #[arg(id = "KAFKA_TOPIC", long = "kafka-topic", env = "KAFKA_TOPIC", default_value = defaults::KAFKA_TOPIC,
          value_parser = setting(parse::topic))]
    pub topic: String,
}

impl Default for EventSettings {
    fn default() -> Self {
        Self {
            ce_source: defaults::CE_SOURCE.to_owned(),
            topic: defaults::KAFKA_TOPIC.to_owned(),
        }
    }
}

/// How long work in flight may take once a stop was requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Args)]
pub struct ShutdownSettings {
    /// On shutdown, how long an in-flight batch may take before it is rolled back.
    #[arg(id = "SHUTDOWN_GRACE", long = "shutdown-grace", env = "SHUTDOWN_GRACE",
          default_value = text!(defaults::SHUTDOWN_GRACE), value_parser = setting(parse::duration))]
    pub grace: Duration,
}

impl Default for ShutdownSettings {
    fn default() -> Self {
        Self {
            grace: defaults::SHUTDOWN_GRACE,
        }
    }
}

/// The outbox publisher's claim, wake-up and retention.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct PublisherSettings {
    /// Outbox rows claimed per transaction.
    #[arg(id = "OUTBOX_BATCH_SIZE", long = "outbox-batch-size", env = "OUTBOX_BATCH_SIZE",
          default_value = text!(defaults::OUTBOX_BATCH_SIZE),
          value_parser = setting(parse::count::<u32, { parse::MAX_OUTBOX_BATCH_SIZE }>))]
    pub batch_size: u32,
    /// Polling period when no commit notification arrives.
    #[arg(id = "OUTBOX_POLL_INTERVAL", long = "outbox-poll-interval", env = "OUTBOX_POLL_INTERVAL",
          default_value = text!(defaults::OUTBOX_POLL_INTERVAL), value_parser = setting(parse::positive_duration))]
    pub poll_interval: Duration,
    /// How long published rows are kept (0s = delete right after publishing).
    #[arg(id = "OUTBOX_RETENTION", long = "outbox-retention", env = "OUTBOX_RETENTION",
          default_value = text!(defaults::OUTBOX_RETENTION), value_parser = setting(parse::duration))]
    pub retention: Duration,
    /// Batches in flight at once while a backlog drains (each its own
    /// transaction and pooled connection; SKIP LOCKED keeps them disjoint).
    #[arg(id = "OUTBOX_CONCURRENCY", long = "outbox-concurrency", env = "OUTBOX_CONCURRENCY",
          default_value = text!(defaults::OUTBOX_CONCURRENCY),
          value_parser = setting(parse::count::<u32, { parse::MAX_OUTBOX_CONCURRENCY }>))]
    pub concurrency: u32,
}

impl Default for PublisherSettings {
    fn default() -> Self {
        Self {
            batch_size: defaults::OUTBOX_BATCH_SIZE,
            poll_interval: defaults::OUTBOX_POLL_INTERVAL,
            retention: defaults::OUTBOX_RETENTION,
            concurrency: defaults::OUTBOX_CONCURRENCY,
        }
    }
}

/// The HTTP endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Args)]
pub struct HttpSettings {
    /// HTTP address for /metrics, /healthz and /readyz.
    #[arg(id = "METRICS_ADDR", long = "metrics-addr", env = "METRICS_ADDR",
          default_value = text!(defaults::METRICS_ADDR), value_parser = setting(parse::socket_addr))]
    pub metrics_addr: SocketAddr,
    /// /healthz fails when no cycle succeeded for this long.
    #[arg(id = "LIVENESS_WINDOW", long = "liveness-window", env = "LIVENESS_WINDOW",
          default_value = text!(defaults::LIVENESS_WINDOW), value_parser = setting(parse::duration))]
    pub liveness_window: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            metrics_addr: defaults::METRICS_ADDR,
            liveness_window: defaults::LIVENESS_WINDOW,
        }
    }
}

/// SASL mechanism and credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct SaslSettings {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: String,
}

impl fmt::Debug for SaslSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SaslSettings")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    #[cfg(feature = "kafka-lz4")]
    Lz4,
    #[cfg(feature = "kafka-zstd")]
    Zstd,
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            #[cfg(feature = "kafka-lz4")]
            Compression::Lz4 => "lz4",
            #[cfg(feature = "kafka-zstd")]
            Compression::Zstd => "zstd",
        })
    }
}

/// The Kafka connection of the publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSettings {
    pub bootstrap_servers: Vec<String>,
    pub client_id: String,
    /// Bounds one whole produce (see [`Settings::stop_grace`]).
    pub request_timeout: Duration,
    pub create_topic: bool,
    pub topic_partitions: i32,
    pub replication_factor: i16,
    pub compression: Compression,
    /// `Some` for `SASL_PLAINTEXT` and `SASL_SSL`.
    pub sasl: Option<SaslSettings>,
    /// `Some` for `SSL` and `SASL_SSL`.
    pub tls: Option<KafkaTls>,
}

impl KafkaSettings {
    /// The `KAFKA_SECURITY_PROTOCOL` these settings amount to.
    pub fn security_protocol(&self) -> SecurityProtocol {
        match (self.tls.is_some(), self.sasl.is_some()) {
            (false, false) => SecurityProtocol::Plaintext,
            (true, false) => SecurityProtocol::Ssl,
            (false, true) => SecurityProtocol::SaslPlaintext,
            (true, true) => SecurityProtocol::SaslSsl,
        }
    }
}

/// Kafka's `security.protocol`, with its names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        })
    }
}

/// TLS to the brokers. Host names are always verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaTls {
    /// `KAFKA_SSL_CA_LOCATION`: a PEM bundle of trusted CAs; `None` means
    /// the bundled webpki roots (Mozilla's list).
    pub ca: Option<PathBuf>,
    /// `KAFKA_SSL_CERTIFICATE_LOCATION` and `KAFKA_SSL_KEY_LOCATION`.
    pub client: Option<KafkaClientCert>,
}

/// A client certificate for mutual TLS: PEM files, read again for every
/// new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaClientCert {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its unencrypted private key (PKCS#8, RSA or SEC1).
    pub key: PathBuf,
}

/// A validated `seed` request.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct SeedSettings {
    /// Active bookings (Reserved, AwaitingPayment and Booked in turn).
    #[arg(long, default_value = text!(defaults::SEED_ACTIVE), value_parser = setting(parse::whole_number))]
    pub active: u64,
    /// Share of the active bookings already due (0.0-1.0).
    #[arg(long, default_value = text!(defaults::SEED_DUE_FRACTION), value_parser = setting(parse::fraction))]
    pub due_fraction: f64,
    /// Terminal or inactive rows beside them.
    #[arg(long, default_value = text!(defaults::SEED_NONE), value_parser = setting(parse::whole_number))]
    pub inactive: u64,
    /// Due legacy rows without deal_id (poison).
    #[arg(long, default_value = text!(defaults::SEED_NONE), value_parser = setting(parse::whole_number))]
    pub poison: u64,
    /// The not-yet-due deadlines are spread over this span from now.
    #[arg(long, default_value = text!(defaults::SEED_SPREAD), value_parser = setting(parse::duration))]
    pub spread: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_url_errors_never_echo_the_password() {
        for raw in [
            "mysql://u:s3cret@h/db",
            "postgres://u:s3cret@/db",
            "not a url s3cret",
            "postgres://u:s3cret@h:99999/db",
        ] {
            let err = DatabaseUrl::parse(raw).unwrap_err();
            assert_eq!(err.setting, "DATABASE_URL");
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
        let url = DatabaseUrl::parse("postgres://u:s3cret@h:5432/db").unwrap();
        assert!(!format!("{url:?}").contains("s3cret"));
    }

    /// Issue 25's defects, through the settings type: the password printed
    /// when it held a '/', and `sslmode` lost after a '?' in the password.
    #[test]
    fn issue_25_passwords_are_redacted_and_sslmode_read() {
        for (raw, password) in [
            ("postgres://app:ab/cd+ef==@host/booking", "ab/cd+ef=="),
            ("postgres://app:a?b@host/booking?sslmode=require", "a?b"),
            ("postgres://app:p@ss@host/booking?sslmode=require", "p@ss"),
            ("postgres://app:x#y z@host/booking?sslmode=require", "x#y z"),
        ] {
            let url = DatabaseUrl::parse(raw).unwrap_or_else(|e| panic!("{raw}: {e}"));
            assert!(!url.redacted().contains(password), "{}", url.redacted());
            assert!(!format!("{url:?}").contains(password), "{url:?}");
            assert!(
                url.redacted()
                    .starts_with("postgres://app:***@host/booking"),
                "{}",
                url.redacted()
            );
            if raw.contains("sslmode=require") {
                assert_eq!(url.tls().mode, pg_tls::SslMode::Require, "{raw}");
            }
        }
    }

    #[test]
    fn database_url_parameters_tokio_postgres_refuses_are_named() {
        for option in ["sslsni", "gssencmode", "sslpassword", "service", "passfile"] {
            let err =
                DatabaseUrl::parse(&format!("postgres://u:s3cret@h/db?{option}=1")).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("DATABASE_URL: invalid connection string (unknown option `{option}`)")
            );
        }
        let err =
            DatabaseUrl::parse("postgres://u:s3cret@h/db?connect_timeout=s3cret").unwrap_err();
        assert!(err.problem.contains("`connect_timeout`"), "{err}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
        let url =
            DatabaseUrl::parse("postgres://u:s3cret@h/db?sslmode=verify-full&application_name=x")
                .unwrap();
        let config = url.config();
        assert_eq!(config.get_application_name(), Some("x"));
        assert_eq!(config.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(config.get_dbname(), Some("db"));
        assert!(!format!("{url:?}").contains("s3cret"));
        assert!(!format!("{config:?}").contains("s3cret"));
    }

    fn database(statement_timeout: Duration) -> DatabaseSettings {
        DatabaseSettings {
            statement_timeout,
            ..DatabaseSettings::new(DatabaseUrl::parse("postgres://h/db").unwrap())
        }
    }

    #[test]
    fn multi_host_urls_parse_and_never_print_the_password() {
        let raw = "postgres://u:s3cret@h1:5433,h2:5434/db?target_session_attrs=read-write\
                   &sslmode=verify-full&application_name=x";
        let url = DatabaseUrl::parse(raw).unwrap();
        assert_eq!(url.tls().mode, pg_tls::SslMode::VerifyFull);
        let config = url.config();
        assert_eq!(config.get_application_name(), Some("x"));
        assert_eq!(config.get_user(), Some("u"));
        assert_eq!(config.get_hosts().len(), 2);
        assert_eq!(config.get_ports(), [5433, 5434]);
        assert_eq!(
            config.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        assert!(url.wants_read_write());
        assert!(
            !DatabaseUrl::parse("postgres://u@h1,h2/db")
                .unwrap()
                .wants_read_write()
        );
        assert_eq!(
            url.redacted(),
            "postgres://u:***@h1:5433,h2:5434/db?target_session_attrs=read-write\
             &sslmode=verify-full&application_name=x"
        );
        assert!(!format!("{url:?}").contains("s3cret"));
        for bad in [
            "postgres://u:s3cret@h1:5433,h2:99999/db",
            "postgres://u:s3cret@h1,/db",
            "postgres://u:s3cret@h1,h2/db?target_session_attrs=primary-ish",
        ] {
            let error = DatabaseUrl::parse(bad).unwrap_err();
            assert!(!error.to_string().contains("s3cret"), "{error}");
        }
        let url = DatabaseUrl::parse("postgres://u@h/db?password=s3cret&user=v").unwrap();
        assert_eq!(url.redacted(), "postgres://u@h/db?password=***&user=v");
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
            bootstrap_servers: vec!["h:9092".into()],
            client_id: defaults::KAFKA_CLIENT_ID.into(),
            request_timeout,
            create_topic: false,
            topic_partitions: defaults::KAFKA_TOPIC_PARTITIONS,
            replication_factor: defaults::KAFKA_REPLICATION_FACTOR,
            compression: defaults::KAFKA_COMPRESSION,
            sasl: None,
            tls: None,
        }
    }

    #[test]
    fn kafka_time_must_fit_half_the_idle_transaction_limit() {
        let secs = Duration::from_secs;
        let fits = |statement: u64, request: u64| {
            check_kafka_fits_idle_transaction(&database(secs(statement)), &kafka(secs(request)))
        };
        assert_eq!(fits(30, 10), Ok(()), "the defaults");
        assert_eq!(
            fits(10, 10),
            Ok(()),
            "the produce may take half the idle limit"
        );
        // The idle limit is 20 s, and a produce of 11-19 s would fit it, but
        // with less margin than the produce itself.
        let error = fits(10, 11).unwrap_err();
        assert_eq!(error.setting, "KAFKA_REQUEST_TIMEOUT");
        assert!(
            error.problem.contains("DATABASE_STATEMENT_TIMEOUT"),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            "KAFKA_REQUEST_TIMEOUT: 11s must be at most DATABASE_STATEMENT_TIMEOUT (10s): \
             a publish transaction waits idle for Kafka and PostgreSQL ends it after twice \
             DATABASE_STATEMENT_TIMEOUT"
        );
        assert!(fits(5, 30).is_err(), "a produce longer than the idle limit");
        assert!(
            check_kafka_fits_idle_transaction(
                &database(defaults::DATABASE_STATEMENT_TIMEOUT),
                &kafka(defaults::KAFKA_REQUEST_TIMEOUT)
            )
            .is_ok()
        );
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
    fn stop_grace_covers_the_batch_grace_and_one_whole_produce() {
        let with_kafka = settings(Some(kafka(Duration::from_secs(3))));
        assert_eq!(
            with_kafka.stop_grace(),
            Duration::from_secs(7 + 3) + STOP_MARGIN
        );
        let worker_only = settings(None);
        assert_eq!(
            worker_only.stop_grace(),
            Duration::from_secs(7) + STOP_MARGIN
        );
    }
}
