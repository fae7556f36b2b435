//! The command line: the commands, each with the groups of settings it
//! uses, and the two groups that need a step after parsing (a required
//! URL, SASL credentials that go together).

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use super::{
    Compression, ConfigError, DatabaseSettings, DatabaseUrl, EventSettings, ExpirySettings,
    HttpSettings, LibpqEnv, Pooler, PublisherSettings, SaslMechanism, SecurityProtocol,
    SeedSettings, ShutdownSettings,
    defaults::{self, text},
    parse::{self, BootstrapServers, setting},
    pg_url::PgUrl,
    secret::Secret,
};

#[derive(Debug, Parser)]
#[command(
    name = "booking-expiration",
    version,
    about = "Expires overdue bookings and publishes BookingExpiredEvent to Kafka"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start; boxing the big variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the embedded migrations (idempotent) and exit.
    Migrate {
        #[command(flatten)]
        database: DatabaseArgs,
        /// Apply nothing: print the pending migrations as JSON and exit 3
        /// when there are any, 0 when the schema is current.
        #[arg(long)]
        check: bool,
    },
    /// Run the expiry worker, the outbox publisher and the HTTP endpoints until SIGTERM/SIGINT.
    Run(RunArgs),
    /// Run exactly one expiry cycle (no publishing) and print its result as a JSON line.
    Once {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        expiry: ExpirySettings,
        #[command(flatten)]
        shutdown: ShutdownSettings,
        #[command(flatten)]
        events: EventSettings,
    },
    /// Show backlog, outbox lag and poison rows without changing anything.
    Status {
        #[command(flatten)]
        database: DatabaseArgs,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Outbox upkeep.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Re-enqueue the events of expired bookings, rebuilt byte for byte from the
    /// audit trail (same key, ce_id, value and headers; the trace context is the
    /// replay's). Bookings are only read.
    Republish(RepublishArgs),
    /// Insert synthetic bookings (demo, benchmarks, load tests).
    Seed {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        seed: SeedSettings,
    },
}

/// The commands of `outbox`.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Put parked rows back so the publisher tries them again; prints how many as JSON.
    Retry {
        #[command(flatten)]
        database: DatabaseArgs,
        /// The event ids (ce_id) of the parked rows to put back.
        #[arg(long = "event-id", num_args = 1.., required_unless_present = "all_parked",
              conflicts_with = "all_parked")]
        event_id: Vec<uuid::Uuid>,
        /// Put back every parked row.
        #[arg(long = "all-parked")]
        all_parked: bool,
    },
}

/// The flags of `republish`. The selection filters combine (all apply);
/// at least one is required.
#[derive(Debug, Clone, Args)]
pub struct RepublishArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub events: EventSettings,
    /// Replay this booking's event (repeatable).
    #[arg(long = "booking-id")]
    pub booking_id: Vec<uuid::Uuid>,
    /// Replay the events of this tenant (repeatable).
    #[arg(long = "tenant")]
    pub tenant: Vec<uuid::Uuid>,
    /// Replay bookings expired at or after this time (RFC 3339).
    #[arg(long = "expired-from", value_parser = setting(parse::instant))]
    pub expired_from: Option<chrono::DateTime<chrono::Utc>>,
    /// Replay bookings expired before this time (RFC 3339).
    #[arg(long = "expired-to", value_parser = setting(parse::instant))]
    pub expired_to: Option<chrono::DateTime<chrono::Utc>>,
    /// Print the events (one JSON line each on stdout) instead of enqueuing them.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Expiry records per transaction.
    #[arg(long = "batch-size", default_value = text!(defaults::REPUBLISH_BATCH_SIZE),
          value_parser = setting(parse::count::<u32, { parse::MAX_OUTBOX_BATCH_SIZE }>))]
    pub batch_size: u32,
    /// Resume: start after this audit record id (the `after` of the last progress line).
    #[arg(long = "after", default_value_t = 0)]
    pub after: i64,
    /// Resume: the replay id of the stopped run (its rows are not enqueued twice).
    #[arg(long = "replay-id")]
    pub replay_id: Option<uuid::Uuid>,
}

/// The flags of `run`, each parsed; [`super::Settings::from_args`]
/// validates them as a whole.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub expiry: ExpirySettings,
    #[command(flatten)]
    pub shutdown: ShutdownSettings,
    #[command(flatten)]
    pub events: EventSettings,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub publisher: PublisherSettings,
    #[command(flatten)]
    pub http: HttpSettings,
    /// Run the publisher only (no expiry cycles).
    #[arg(
        id = "NO_WORKER",
        long = "no-worker",
        env = "NO_WORKER",
        default_value_t = false
    )]
    pub no_worker: bool,
    /// Run the expiry worker only (outbox rows wait for another instance).
    #[arg(
        id = "NO_PUBLISHER",
        long = "no-publisher",
        env = "NO_PUBLISHER",
        default_value_t = false
    )]
    pub no_publisher: bool,
}

/// The database flags; the URL is required by every command, which
/// [`Self::settings`] checks so the error is one line like the others.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL (postgres://user:password@host:port/database).
    #[arg(id = "DATABASE_URL", long = "database-url", env = "DATABASE_URL", hide_env_values = true,
          value_parser = setting(database_url))]
    pub database_url: Option<PgUrl>,
    /// Maximum connections in the pool.
    #[arg(id = "DATABASE_POOL_SIZE", long = "database-pool-size", env = "DATABASE_POOL_SIZE",
          default_value = text!(defaults::DATABASE_POOL_SIZE),
          value_parser = setting(parse::count::<u32, { parse::MAX_POOL_SIZE }>))]
    pub database_pool_size: u32,
    /// Time to wait for a connection.
    #[arg(id = "DATABASE_CONNECT_TIMEOUT", long = "database-connect-timeout", env = "DATABASE_CONNECT_TIMEOUT",
          default_value = text!(defaults::DATABASE_CONNECT_TIMEOUT), value_parser = setting(parse::positive_duration))]
    pub database_connect_timeout: Duration,
    /// Server-side limit of one statement.
    #[arg(id = "DATABASE_STATEMENT_TIMEOUT", long = "database-statement-timeout", env = "DATABASE_STATEMENT_TIMEOUT",
          default_value = text!(defaults::DATABASE_STATEMENT_TIMEOUT), value_parser = setting(parse::positive_duration))]
    pub database_statement_timeout: Duration,
    /// none or transaction: a pooler in transaction mode (PgBouncer
    /// pool_mode=transaction) between the worker and PostgreSQL.
    #[arg(id = "DATABASE_POOLER", long = "database-pooler", env = "DATABASE_POOLER",
          default_value = text!(defaults::DATABASE_POOLER), value_parser = setting(parse::pooler))]
    pub database_pooler: Pooler,
    /// A direct PostgreSQL URL past the pooler, for what needs a session:
    /// the commit wake-up (LISTEN) and migrate.
    #[arg(id = "DATABASE_DIRECT_URL", long = "database-direct-url", env = "DATABASE_DIRECT_URL",
          hide_env_values = true, value_parser = setting(database_url))]
    pub database_direct_url: Option<PgUrl>,
    /// libpq's environment (`PGHOST`, `PGPASSWORD`, `PGSSLMODE`, ...): each
    /// where the URLs leave its parameter out.
    #[command(flatten)]
    pub libpq: LibpqEnv,
}

/// A URL's grammar (libpq's, [`PgUrl::parse`]): what it means, its TLS
/// parameters included, is settled with libpq's environment in
/// [`DatabaseArgs::settings`] (a `PGSSLCERT` may complete the URL's
/// `sslkey`, say).
fn database_url(raw: &str) -> Result<PgUrl, parse::Problem> {
    PgUrl::parse(raw).map_err(|error| error.to_string())
}

impl DatabaseArgs {
    /// The settings, libpq's environment applied to both URLs.
    pub fn settings(self) -> Result<DatabaseSettings, ConfigError> {
        let url = self
            .database_url
            .ok_or_else(|| ConfigError::new("DATABASE_URL", "is required (a postgres:// URL)"))
            .and_then(|url| DatabaseUrl::with_env(url, &self.libpq, "DATABASE_URL"))?;
        let direct_url = self
            .database_direct_url
            .map(|direct| DatabaseUrl::with_env(direct, &self.libpq, "DATABASE_DIRECT_URL"))
            .transpose()?;
        Ok(DatabaseSettings {
            url,
            pool_size: self.database_pool_size,
            connect_timeout: self.database_connect_timeout,
            statement_timeout: self.database_statement_timeout,
            pooler: self.database_pooler,
            direct_url,
            is_direct: false,
        })
    }
}

/// The Kafka flags; [`super::Settings::from_args`] makes them a
/// [`super::KafkaSettings`] when the publisher runs.
#[derive(Debug, Clone, Args)]
pub struct KafkaArgs {
    /// Comma-separated host:port list.
    #[arg(id = "KAFKA_BOOTSTRAP_SERVERS", long = "kafka-bootstrap-servers", env = "KAFKA_BOOTSTRAP_SERVERS",
          value_parser = setting(parse::bootstrap_servers))]
    pub kafka_bootstrap_servers: Option<BootstrapServers>,
    /// Client id sent to the broker.
    #[arg(id = "KAFKA_CLIENT_ID", long = "kafka-client-id", env = "KAFKA_CLIENT_ID",
          default_value = defaults::KAFKA_CLIENT_ID)]
    pub kafka_client_id: String,
    /// Limit of one metadata or produce exchange, retries included.
    #[arg(id = "KAFKA_REQUEST_TIMEOUT", long = "kafka-request-timeout", env = "KAFKA_REQUEST_TIMEOUT",
          default_value = text!(defaults::KAFKA_REQUEST_TIMEOUT), value_parser = setting(parse::positive_duration))]
    pub kafka_request_timeout: Duration,
    /// Create the topic when it does not exist (otherwise a missing topic is an error).
    #[arg(
        id = "KAFKA_CREATE_TOPIC",
        long = "kafka-create-topic",
        env = "KAFKA_CREATE_TOPIC",
        default_value_t = false
    )]
    pub kafka_create_topic: bool,
    /// Partitions of a topic created by KAFKA_CREATE_TOPIC.
    #[arg(id = "KAFKA_TOPIC_PARTITIONS", long = "kafka-topic-partitions", env = "KAFKA_TOPIC_PARTITIONS",
          default_value = text!(defaults::KAFKA_TOPIC_PARTITIONS),
          value_parser = setting(parse::count::<i32, { parse::MAX_TOPIC_PARTITIONS }>))]
    pub kafka_topic_partitions: i32,
    /// Replication factor of a topic created by KAFKA_CREATE_TOPIC.
    #[arg(id = "KAFKA_REPLICATION_FACTOR", long = "kafka-replication-factor", env = "KAFKA_REPLICATION_FACTOR",
          default_value = text!(defaults::KAFKA_REPLICATION_FACTOR),
          value_parser = setting(parse::count::<i16, { parse::MAX_REPLICATION_FACTOR }>))]
    pub kafka_replication_factor: i16,
    /// none, gzip or snappy (lz4/zstd with their opt-in features).
    #[arg(id = "KAFKA_COMPRESSION", long = "kafka-compression", env = "KAFKA_COMPRESSION",
          default_value = text!(defaults::KAFKA_COMPRESSION), value_parser = setting(parse::compression))]
    pub kafka_compression: Compression,
    /// PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; unset = no SASL.
    // An empty value also means no SASL, hence one value that may say
    // "none" (`std::option::Option`) with an empty, hidden default.
    #[arg(id = "KAFKA_SASL_MECHANISM", long = "kafka-sasl-mechanism", env = "KAFKA_SASL_MECHANISM",
          default_value = "", hide_default_value = true, value_parser = setting(parse::sasl_mechanism))]
    pub kafka_sasl_mechanism: std::option::Option<SaslMechanism>,
    #[arg(
        id = "KAFKA_SASL_USERNAME",
        long = "kafka-sasl-username",
        env = "KAFKA_SASL_USERNAME"
    )]
    pub kafka_sasl_username: Option<String>,
    #[arg(
        id = "KAFKA_SASL_PASSWORD",
        long = "kafka-sasl-password",
        env = "KAFKA_SASL_PASSWORD",
        hide_env_values = true,
        // A password may start with '-': a value, never a flag (clap's
        // usage error would quote it).
        allow_hyphen_values = true,
        value_parser = setting(super::secret::parse)
    )]
    pub kafka_sasl_password: Option<Secret>,
    /// PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (any case); unset =
    /// SASL_PLAINTEXT with a SASL mechanism, PLAINTEXT without.
    #[arg(id = "KAFKA_SECURITY_PROTOCOL", long = "kafka-security-protocol", env = "KAFKA_SECURITY_PROTOCOL",
          default_value = "", hide_default_value = true, value_parser = setting(parse::security_protocol))]
    pub kafka_security_protocol: std::option::Option<SecurityProtocol>,
    #[command(flatten)]
    pub tls: KafkaTlsArgs,
}

/// The TLS files of `KAFKA_SECURITY_PROTOCOL=SSL` or `SASL_SSL` (PEM),
/// read again for every new connection.
#[derive(Debug, Clone, Args)]
pub struct KafkaTlsArgs {
    /// PEM bundle of the CAs trusted for the brokers; unset = the bundled webpki (Mozilla) roots.
    #[arg(
        id = "KAFKA_SSL_CA_LOCATION",
        long = "kafka-ssl-ca-location",
        env = "KAFKA_SSL_CA_LOCATION"
    )]
    pub kafka_ssl_ca_location: Option<PathBuf>,
    /// PEM client certificate (chain) for mutual TLS; needs KAFKA_SSL_KEY_LOCATION.
    #[arg(
        id = "KAFKA_SSL_CERTIFICATE_LOCATION",
        long = "kafka-ssl-certificate-location",
        env = "KAFKA_SSL_CERTIFICATE_LOCATION"
    )]
    pub kafka_ssl_certificate_location: Option<PathBuf>,
    /// PEM unencrypted private key of KAFKA_SSL_CERTIFICATE_LOCATION.
    #[arg(
        id = "KAFKA_SSL_KEY_LOCATION",
        long = "kafka-ssl-key-location",
        env = "KAFKA_SSL_KEY_LOCATION"
    )]
    pub kafka_ssl_key_location: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    use super::{super::Settings, *};

    /// Parses `args` as the binary would, with the environment ignored so
    /// the outcome depends on the arguments alone.
    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        let command =
            Cli::command().mut_subcommands(|sub| sub.mut_args(|arg| arg.env(None::<&'static str>)));
        let matches = command.try_get_matches_from(
            std::iter::once("booking-expiration").chain(args.iter().copied()),
        )?;
        Ok(Cli::from_arg_matches(&matches)?.command)
    }

    fn run(args: &[&str]) -> Result<Settings, ConfigError> {
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        match parse(&all) {
            Ok(Command::Run(args)) => Settings::from_args(args),
            Ok(other) => panic!("not run: {other:?}"),
            Err(error) => Err(ConfigError::from_clap(&error)
                .unwrap_or_else(|| panic!("not a setting error: {error}"))),
        }
    }

    const REQUIRED: [&str; 4] = [
        "--database-url",
        "postgres://u:hunter2@h/db",
        "--kafka-bootstrap-servers",
        "h:9092",
    ];

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_without_settings_gets_the_defaults() {
        let settings = run(&REQUIRED).unwrap();
        assert_eq!(settings.expiry, ExpirySettings::default());
        assert_eq!(settings.events, EventSettings::default());
        assert_eq!(settings.publisher, PublisherSettings::default());
        assert_eq!(settings.http, HttpSettings::default());
        assert_eq!(settings.shutdown, ShutdownSettings::default());
        assert_eq!(settings.database.pool_size, defaults::DATABASE_POOL_SIZE);
        assert_eq!(
            settings.database.connect_timeout,
            defaults::DATABASE_CONNECT_TIMEOUT
        );
        assert_eq!(
            settings.database.statement_timeout,
            defaults::DATABASE_STATEMENT_TIMEOUT
        );
        assert_eq!(settings.database.pooler, defaults::DATABASE_POOLER);
        assert_eq!(settings.database.direct_url, None);
        let kafka = settings.kafka.expect("the publisher runs by default");
        assert_eq!(kafka.bootstrap_servers, ["h:9092"]);
        assert_eq!(kafka.client_id, defaults::KAFKA_CLIENT_ID);
        assert_eq!(kafka.request_timeout, defaults::KAFKA_REQUEST_TIMEOUT);
        assert_eq!(kafka.topic_partitions, defaults::KAFKA_TOPIC_PARTITIONS);
        assert_eq!(kafka.replication_factor, defaults::KAFKA_REPLICATION_FACTOR);
        assert_eq!(kafka.compression, defaults::KAFKA_COMPRESSION);
        assert_eq!(kafka.sasl, None);
        assert!(settings.roles.worker && settings.roles.publisher);

        let Command::Seed { seed, .. } = parse(&["seed"]).unwrap() else {
            panic!("seed");
        };
        assert_eq!(seed.active, defaults::SEED_ACTIVE);
        assert_eq!(seed.due_fraction, defaults::SEED_DUE_FRACTION);
        assert_eq!((seed.inactive, seed.poison), (0, 0));
        assert_eq!(seed.spread, defaults::SEED_SPREAD);

        let Command::Republish(republish) = parse(&[
            "republish",
            "--tenant",
            "00000000-0000-0000-0000-000000000001",
        ])
        .unwrap() else {
            panic!("republish");
        };
        assert_eq!(republish.batch_size, defaults::REPUBLISH_BATCH_SIZE);
        assert_eq!((republish.after, republish.dry_run), (0, false));
        assert_eq!(republish.events.topic, defaults::KAFKA_TOPIC);
        let Command::Republish(window) = parse(&[
            "republish",
            "--expired-from",
            "2026-12-01T00:00:00Z",
            "--expired-to",
            "2026-12-02T00:00:00+01:00",
        ])
        .unwrap() else {
            panic!("republish");
        };
        assert_eq!(
            window.expired_to.map(|t| t.to_rfc3339()),
            Some("2026-12-01T23:00:00+00:00".to_owned())
        );
        assert!(parse(&["republish", "--expired-from", "yesterday"]).is_err());
    }

    #[test]
    fn flags_and_variables_keep_their_names() {
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("run");
        let names: Vec<(String, String)> = run
            .get_arguments()
            .filter_map(|arg| {
                let env = arg.get_env()?.to_str()?;
                assert_eq!(arg.get_id(), env, "a setting's id is its variable");
                Some((arg.get_long()?.to_owned(), env.to_owned()))
            })
            .collect();
        let expected = [
            "DATABASE_URL",
            "DATABASE_POOL_SIZE",
            "DATABASE_CONNECT_TIMEOUT",
            "DATABASE_STATEMENT_TIMEOUT",
            "DATABASE_POOLER",
            "DATABASE_DIRECT_URL",
            "PGHOST",
            "PGPORT",
            "PGDATABASE",
            "PGUSER",
            "PGPASSWORD",
            "PGPASSFILE",
            "PGSSLMODE",
            "PGSSLROOTCERT",
            "PGSSLCERT",
            "PGSSLKEY",
            "PGAPPNAME",
            "PGCONNECT_TIMEOUT",
            "EXPIRATION_INTERVAL",
            "EXPIRATION_BATCH_SIZE",
            "EXPIRATION_MAX_BATCHES_PER_CYCLE",
            "EXPIRATION_CYCLE_BUDGET",
            "EXPIRATION_MAX_CLOCK_SKEW",
            "EXPIRATION_DEADLINE_WAKE",
            "EXPIRATION_MIN_GAP",
            "SHUTDOWN_GRACE",
            "CE_SOURCE",
            "KAFKA_TOPIC",
            "KAFKA_BOOTSTRAP_SERVERS",
            "KAFKA_CLIENT_ID",
            "KAFKA_REQUEST_TIMEOUT",
            "KAFKA_CREATE_TOPIC",
            "KAFKA_TOPIC_PARTITIONS",
            "KAFKA_REPLICATION_FACTOR",
            "KAFKA_COMPRESSION",
            "KAFKA_SASL_MECHANISM",
            "KAFKA_SASL_USERNAME",
            "KAFKA_SASL_PASSWORD",
            "KAFKA_SECURITY_PROTOCOL",
            "KAFKA_SSL_CA_LOCATION",
            "KAFKA_SSL_CERTIFICATE_LOCATION",
            "KAFKA_SSL_KEY_LOCATION",
            "OUTBOX_BATCH_SIZE",
            "OUTBOX_POLL_INTERVAL",
            "OUTBOX_RETENTION",
            "OUTBOX_CONCURRENCY",
            "METRICS_ADDR",
            "LIVENESS_WINDOW",
            "NO_WORKER",
            "NO_PUBLISHER",
        ]
        .map(|env| (env.to_lowercase().replace('_', "-"), env.to_owned()));
        assert_eq!(names, expected);
    }

    #[test]
    fn a_bad_value_is_a_setting_error_without_the_value() {
        let error = run(&[&REQUIRED[..], &["--expiration-batch-size", "0"]].concat()).unwrap_err();
        assert_eq!(
            error,
            ConfigError::new("EXPIRATION_BATCH_SIZE", "must be at least 1, got 0")
        );
        let error = run(&["--database-url", "mysql://u:hunter2@h/db"]).unwrap_err();
        assert_eq!(error.setting, "DATABASE_URL");
        assert!(!error.to_string().contains("hunter2"), "{error}");
        let Err(error) = parse(&["seed", "--due-fraction", "2"]) else {
            panic!("--due-fraction 2 accepted");
        };
        let error = ConfigError::from_clap(&error).expect("a setting error");
        assert_eq!(
            error.to_string(),
            "--due-fraction: \"2\" is not between 0 and 1"
        );
        let Err(error) = parse(&["run", "--no-such-flag"]) else {
            panic!("unknown flag accepted");
        };
        assert_eq!(
            ConfigError::from_clap(&error),
            None,
            "clap's own usage error"
        );
    }

    #[test]
    fn the_pooler_and_the_direct_url() {
        let settings = run(&[
            &REQUIRED[..],
            &[
                "--database-pooler",
                "transaction",
                "--database-direct-url",
                "postgres://u:hunter2@db:5432/crm",
            ],
        ]
        .concat())
        .unwrap();
        assert_eq!(settings.database.pooler, Pooler::Transaction);
        assert!(settings.database.direct_url.is_some());
        let error =
            run(&[&REQUIRED[..], &["--database-pooler", "statement"]].concat()).unwrap_err();
        assert_eq!(error.setting, "DATABASE_POOLER");
        let error = run(&[
            &REQUIRED[..],
            &["--database-direct-url", "mysql://u:hunter2@db/crm"],
        ]
        .concat())
        .unwrap_err();
        assert_eq!(error.setting, "DATABASE_DIRECT_URL");
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }

    #[test]
    fn rules_that_span_settings() {
        let with = |extra: &[&str]| run(&[&REQUIRED[..], extra].concat());
        assert_eq!(
            with(&["--no-worker", "--no-publisher"])
                .unwrap_err()
                .setting,
            "NO_WORKER"
        );
        assert_eq!(
            run(&["--database-url", "postgres://h/db"])
                .unwrap_err()
                .setting,
            "KAFKA_BOOTSTRAP_SERVERS"
        );
        let worker_only = run(&["--database-url", "postgres://h/db", "--no-publisher"]).unwrap();
        assert_eq!(worker_only.kafka, None);
        assert!(!worker_only.roles.publisher);
        assert_eq!(
            with(&["--kafka-sasl-mechanism", "PLAIN"])
                .unwrap_err()
                .setting,
            "KAFKA_SASL_USERNAME"
        );
        assert_eq!(
            with(&[
                "--kafka-sasl-mechanism",
                "PLAIN",
                "--kafka-sasl-username",
                "u"
            ])
            .unwrap_err()
            .setting,
            "KAFKA_SASL_PASSWORD"
        );
        let sasl = with(&[
            "--kafka-sasl-mechanism",
            "plain",
            "--kafka-sasl-username",
            "u",
            "--kafka-sasl-password",
            "p",
        ])
        .unwrap();
        let sasl = sasl.kafka.and_then(|k| k.sasl).expect("SASL");
        assert_eq!(sasl.mechanism, SaslMechanism::Plain);
        assert!(
            with(&["--kafka-sasl-mechanism", ""])
                .unwrap()
                .kafka
                .unwrap()
                .sasl
                .is_none()
        );
        let error = with(&["--kafka-request-timeout", "31s"]).unwrap_err();
        assert_eq!(error.setting, "KAFKA_REQUEST_TIMEOUT");
        assert!(
            error.problem.contains("DATABASE_STATEMENT_TIMEOUT"),
            "{error}"
        );
        assert!(
            with(&["--kafka-request-timeout", "31s", "--no-publisher"]).is_ok(),
            "no Kafka, no rule"
        );
    }

    #[test]
    fn kafka_security_protocol_agrees_with_sasl_and_tls_settings() {
        use crate::config::SecurityProtocol::*;
        let with = |extra: &[&str]| run(&[&REQUIRED[..], extra].concat());
        let protocol = |extra: &[&str]| with(extra).map(|s| s.kafka.unwrap().security_protocol());
        let sasl = [
            "--kafka-sasl-mechanism",
            "SCRAM-SHA-512",
            "--kafka-sasl-username",
            "u",
            "--kafka-sasl-password",
            "hunter2",
        ];
        assert_eq!(protocol(&[]), Ok(Plaintext));
        assert_eq!(protocol(&sasl), Ok(SaslPlaintext), "as before the setting");
        assert_eq!(
            protocol(&[&sasl[..], &["--kafka-security-protocol", "sasl_ssl"]].concat()),
            Ok(SaslSsl)
        );
        assert_eq!(
            protocol(&["--kafka-security-protocol", "Ssl"]),
            Ok(Ssl),
            "any case, as librdkafka"
        );
        let error = with(&[&sasl[..], &["--kafka-security-protocol", "SSL"]].concat()).unwrap_err();
        assert_eq!(error.setting, "KAFKA_SASL_MECHANISM");
        assert!(error.problem.contains("SSL uses no SASL"), "{error}");
        let error = with(&["--kafka-security-protocol", "SASL_SSL"]).unwrap_err();
        assert_eq!(error.setting, "KAFKA_SASL_MECHANISM");
        let error = with(&["--kafka-ssl-ca-location", "/etc/ca.pem"]).unwrap_err();
        assert_eq!(error.setting, "KAFKA_SSL_CA_LOCATION");
        assert!(error.problem.contains("PLAINTEXT uses no TLS"), "{error}");
        let tls = ["--kafka-security-protocol", "SSL"];
        let error = with(&[&tls[..], &["--kafka-ssl-certificate-location", "/c.pem"]].concat())
            .unwrap_err();
        assert_eq!(error.setting, "KAFKA_SSL_KEY_LOCATION");
        let error =
            with(&[&tls[..], &["--kafka-ssl-key-location", "/k.pem"]].concat()).unwrap_err();
        assert_eq!(error.setting, "KAFKA_SSL_CERTIFICATE_LOCATION");
        let settings = with(&tls).unwrap().kafka.unwrap();
        assert_eq!(settings.tls.unwrap().ca, None, "the bundled roots");
        if crate::tls::cpu_supported() {
            // The files are read by the start-up check that follows parsing.
            let settings = with(
                &[
                    &tls[..],
                    &["--kafka-ssl-ca-location", "/nonexistent/ca.pem"],
                ]
                .concat(),
            )
            .unwrap();
            let error = (crate::app::STARTUP_CHECKS.kafka)(&settings.kafka.unwrap()).unwrap_err();
            assert_eq!(error.setting, "KAFKA_SSL_CA_LOCATION");
            assert!(error.problem.contains("cannot read"), "{error}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

        /// `Debug` of the parsed command line and of the settings (what a
        /// panic message or a `{:?}` in a log would print), and every
        /// setting error, hold neither the database password (in the URL
        /// raw, or percent-encoded, or `PGPASSWORD`) nor `KAFKA_SASL_PASSWORD`.
        #[test]
        fn no_debug_of_the_settings_holds_a_secret(
            secret in "[ -~é€]{10,30}",
            raw in proptest::bool::ANY,
        ) {
            let written = if raw { secret.clone() } else { super::super::pg_url::percent_encode(&secret) };
            let url = format!("postgres://app:{written}@db.example:5432/crm?sslmode=require");
            let direct = format!("postgres://app@db.example/crm?password={}", super::super::pg_url::percent_encode(&secret));
            let args = [
                "run", "--database-url", &url, "--database-direct-url", &direct,
                "--kafka-bootstrap-servers", "k:9092", "--kafka-sasl-mechanism", "SCRAM-SHA-512",
                "--kafka-sasl-username", "be", "--kafka-sasl-password", &secret,
                "--pgpassword", &secret,
            ];
            let forms = [secret.clone(), super::super::pg_url::percent_encode(&secret)];
            let hidden = |text: String| {
                for form in &forms {
                    proptest::prop_assert!(!text.contains(form.as_str()), "{}", text);
                }
                Ok(())
            };
            match parse(&args) {
                Ok(command) => {
                    hidden(format!("{command:?}"))?;
                    let Command::Run(run_args) = command else {
                        panic!("not run");
                    };
                    match Settings::from_args(run_args) {
                        Ok(settings) => hidden(format!("{settings:?}"))?,
                        Err(error) => hidden(format!("{error} {error:?}"))?,
                    }
                }
                Err(error) => {
                    let config = ConfigError::from_clap(&error).expect("a setting error");
                    hidden(format!("{config} {config:?}"))?;
                }
            }
            // A bad setting beside the secrets: the exit-2 line.
            let mut bad = args.to_vec();
            bad.extend(["--expiration-batch-size", "0"]);
            let error = parse(&bad).err().and_then(|e| ConfigError::from_clap(&e));
            if let Some(error) = error {
                hidden(format!("{error} {error:?}"))?;
            }
        }
    }
}
