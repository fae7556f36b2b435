//! The command line: the commands, each with the groups of settings it
//! uses, and the two groups that need a step after parsing (a required
//! URL, SASL credentials that go together).

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use super::{
    Compression, ConfigError, DatabaseSettings, EventSettings, ExpirySettings, HttpSettings,
    KafkaClientCert, KafkaSettings, KafkaTls, Pooler, PublisherSettings, SaslMechanism,
    SaslSettings, SecurityProtocol, SeedSettings, ShutdownSettings,
    defaults::{self, text},
    parse::{self, BootstrapServers, Problem, setting},
    ranges,
    secret::Secret,
};
use crate::libpq::{
    self, DatabaseUrl, env,
    ssl::SslMode,
    url::{Password, PgUrl},
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
    /// Expiry records per transaction; 1 to 10000.
    #[arg(long = "batch-size", default_value = text!(defaults::REPUBLISH_BATCH_SIZE),
          value_parser = parse::count_within::<u32>(&ranges::REPUBLISH_BATCH_SIZE))]
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
    /// Maximum connections in the pool; 1 to 1000.
    #[arg(id = "DATABASE_POOL_SIZE", long = "database-pool-size", env = "DATABASE_POOL_SIZE",
          default_value = text!(defaults::DATABASE_POOL_SIZE),
          value_parser = parse::count_within::<u32>(&ranges::DATABASE_POOL_SIZE))]
    pub database_pool_size: u32,
    /// Time to wait for a connection; 100ms to 10m.
    #[arg(id = "DATABASE_CONNECT_TIMEOUT", long = "database-connect-timeout", env = "DATABASE_CONNECT_TIMEOUT",
          default_value = text!(defaults::DATABASE_CONNECT_TIMEOUT), value_parser = parse::within(&ranges::DATABASE_CONNECT_TIMEOUT))]
    pub database_connect_timeout: Duration,
    /// Server-side limit of one statement (twice that for an idle transaction); 1s to 12d.
    #[arg(id = "DATABASE_STATEMENT_TIMEOUT", long = "database-statement-timeout", env = "DATABASE_STATEMENT_TIMEOUT",
          default_value = text!(defaults::DATABASE_STATEMENT_TIMEOUT), value_parser = parse::within(&ranges::DATABASE_STATEMENT_TIMEOUT))]
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
    pub libpq: LibpqArgs,
}

/// A URL's grammar (libpq's, [`PgUrl::parse`]): what it means, its TLS
/// parameters included, is settled with libpq's environment in
/// [`DatabaseArgs::settings`] (a `PGSSLCERT` may complete the URL's
/// `sslkey`, say).
fn database_url(raw: &str) -> Result<PgUrl, parse::Problem> {
    PgUrl::parse(raw).map_err(|error| error.to_string())
}

/// The libpq variables, each the default of one URL parameter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct LibpqArgs {
    /// Default host(s) when the URL has none: names, addresses or Unix
    /// socket directories, comma-separated (libpq's PGHOST).
    #[arg(id = "PGHOST", long = "pghost", env = "PGHOST", value_parser = setting(non_empty))]
    pub host: Option<String>,
    /// Default port(s) when the URL has none, comma-separated (libpq's PGPORT).
    #[arg(id = "PGPORT", long = "pgport", env = "PGPORT", value_parser = setting(env::ports))]
    pub port: Option<String>,
    /// Default database when the URL names none (libpq's PGDATABASE).
    #[arg(id = "PGDATABASE", long = "pgdatabase", env = "PGDATABASE", value_parser = setting(non_empty))]
    pub dbname: Option<String>,
    /// Default user when the URL names none (libpq's PGUSER).
    #[arg(id = "PGUSER", long = "pguser", env = "PGUSER", value_parser = setting(non_empty))]
    pub user: Option<String>,
    /// Password when the URL has none (libpq's PGPASSWORD; prefer a
    /// password file, the environment of a process is easier to read).
    #[arg(id = "PGPASSWORD", long = "pgpassword", env = "PGPASSWORD", hide_env_values = true,
          allow_hyphen_values = true, value_parser = setting(secret))]
    pub password: Option<Secret>,
    /// Password file read when neither the URL nor PGPASSWORD gives a
    /// password; default ~/.pgpass (libpq's PGPASSFILE).
    #[arg(id = "PGPASSFILE", long = "pgpassfile", env = "PGPASSFILE", value_parser = setting(path))]
    pub passfile: Option<PathBuf>,
    /// Default sslmode (libpq's PGSSLMODE).
    // An empty value is unset too, hence one value that may say "none"
    // (`std::option::Option`) with an empty, hidden default.
    #[arg(id = "PGSSLMODE", long = "pgsslmode", env = "PGSSLMODE", default_value = "",
          hide_default_value = true, value_parser = setting(env::sslmode))]
    pub sslmode: std::option::Option<SslMode>,
    /// Default sslrootcert (libpq's PGSSLROOTCERT).
    #[arg(id = "PGSSLROOTCERT", long = "pgsslrootcert", env = "PGSSLROOTCERT", value_parser = setting(non_empty))]
    pub sslrootcert: Option<String>,
    /// Default sslcert (libpq's PGSSLCERT).
    #[arg(id = "PGSSLCERT", long = "pgsslcert", env = "PGSSLCERT", value_parser = setting(non_empty))]
    pub sslcert: Option<String>,
    /// Default sslkey (libpq's PGSSLKEY).
    #[arg(id = "PGSSLKEY", long = "pgsslkey", env = "PGSSLKEY", value_parser = setting(non_empty))]
    pub sslkey: Option<String>,
    /// Default application_name (libpq's PGAPPNAME).
    #[arg(id = "PGAPPNAME", long = "pgappname", env = "PGAPPNAME", value_parser = setting(non_empty))]
    pub appname: Option<String>,
    /// Default connect_timeout, whole seconds per host (libpq's
    /// PGCONNECT_TIMEOUT); DATABASE_CONNECT_TIMEOUT still bounds the whole
    /// connection.
    #[arg(id = "PGCONNECT_TIMEOUT", long = "pgconnect-timeout", env = "PGCONNECT_TIMEOUT",
          value_parser = setting(env::seconds))]
    pub connect_timeout: Option<String>,
}

impl LibpqArgs {
    /// libpq's environment as these flags give it.
    pub fn env(&self) -> libpq::Env {
        libpq::Env {
            host: self.host.clone(),
            port: self.port.clone(),
            dbname: self.dbname.clone(),
            user: self.user.clone(),
            password: self
                .password
                .as_ref()
                .map(|secret| Password::new(secret.expose())),
            passfile: self.passfile.clone(),
            sslmode: self.sslmode,
            sslrootcert: self.sslrootcert.clone(),
            sslcert: self.sslcert.clone(),
            sslkey: self.sslkey.clone(),
            appname: self.appname.clone(),
            connect_timeout: self.connect_timeout.clone(),
        }
    }
}

/// Any text but an empty one (an empty variable is unset).
fn non_empty(raw: &str) -> Result<String, Problem> {
    Ok(raw.to_owned())
}

fn secret(raw: &str) -> Result<Secret, Problem> {
    Ok(Secret::new(raw))
}

fn path(raw: &str) -> Result<PathBuf, Problem> {
    Ok(PathBuf::from(raw))
}

impl DatabaseArgs {
    /// The settings, libpq's environment applied to both URLs.
    pub fn settings(self) -> Result<DatabaseSettings, ConfigError> {
        let env = self.libpq.env();
        let url = self
            .database_url
            .ok_or_else(|| ConfigError::new("DATABASE_URL", "is required (a postgres:// URL)"))?;
        let url = DatabaseUrl::with_env(url, &env, "DATABASE_URL")?;
        let direct_url = self
            .database_direct_url
            .map(|direct| DatabaseUrl::with_env(direct, &env, "DATABASE_DIRECT_URL"))
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
    /// Limit of one metadata read or one partition's produce request; 100ms to 10m.
    #[arg(id = "KAFKA_REQUEST_TIMEOUT", long = "kafka-request-timeout", env = "KAFKA_REQUEST_TIMEOUT",
          default_value = text!(defaults::KAFKA_REQUEST_TIMEOUT), value_parser = parse::within(&ranges::KAFKA_REQUEST_TIMEOUT))]
    pub kafka_request_timeout: Duration,
    /// Create the topic when it does not exist (otherwise a missing topic is an error).
    #[arg(
        id = "KAFKA_CREATE_TOPIC",
        long = "kafka-create-topic",
        env = "KAFKA_CREATE_TOPIC",
        default_value_t = false
    )]
    pub kafka_create_topic: bool,
    /// Partitions of a topic created by KAFKA_CREATE_TOPIC; 1 to 10000.
    #[arg(id = "KAFKA_TOPIC_PARTITIONS", long = "kafka-topic-partitions", env = "KAFKA_TOPIC_PARTITIONS",
          default_value = text!(defaults::KAFKA_TOPIC_PARTITIONS),
          value_parser = parse::count_within::<i32>(&ranges::KAFKA_TOPIC_PARTITIONS))]
    pub kafka_topic_partitions: i32,
    /// Replication factor of a topic created by KAFKA_CREATE_TOPIC; 1 to 32.
    #[arg(id = "KAFKA_REPLICATION_FACTOR", long = "kafka-replication-factor", env = "KAFKA_REPLICATION_FACTOR",
          default_value = text!(defaults::KAFKA_REPLICATION_FACTOR),
          value_parser = parse::count_within::<i16>(&ranges::KAFKA_REPLICATION_FACTOR))]
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

impl KafkaArgs {
    /// Builds the Kafka group: the servers are required for the publisher,
    /// and a SASL mechanism needs its username and password.
    pub(super) fn settings(self) -> Result<KafkaSettings, ConfigError> {
        kafka_settings(self)
    }
}

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
                .map(Secret::into_inner)
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
/// start by `outbox::kafka::tls_bridge::check` (and read again for every
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
            ConfigError::new("EXPIRATION_BATCH_SIZE", "must be from 1 to 100000, got 0")
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
        // No transaction waits on Kafka: its timeout and the statement
        // timeout no longer constrain each other.
        assert!(
            with(&[
                "--kafka-request-timeout",
                "5m",
                "--database-statement-timeout",
                "1s"
            ])
            .is_ok()
        );
    }

    #[test]
    fn the_liveness_window_spans_a_tick() {
        let with = |extra: &[&str]| run(&[&REQUIRED[..], extra].concat());
        for (window, interval) in [("60s", "60s"), ("1s", "2s")] {
            let error = with(&[
                "--liveness-window",
                window,
                "--expiration-interval",
                interval,
            ])
            .unwrap_err();
            assert_eq!(error.setting, "LIVENESS_WINDOW");
            assert!(error.problem.contains("EXPIRATION_INTERVAL"), "{error}");
        }
        assert!(
            with(&[
                "--liveness-window",
                "1500ms",
                "--expiration-interval",
                "300ms"
            ])
            .is_ok()
        );
        assert!(
            with(&[
                "--liveness-window",
                "1s",
                "--expiration-interval",
                "1h",
                "--no-worker"
            ])
            .is_ok(),
            "no worker, no cycles to wait for"
        );
    }

    /// How a setting is written on the command line and named in errors:
    /// its variable, or its flag for flags without one.
    fn setting_key(arg: &clap::Arg) -> Option<String> {
        match arg.get_env() {
            Some(env) => env.to_str().map(str::to_owned),
            None => arg.get_long().map(|long| format!("--{long}")),
        }
    }

    /// Every argument of every command, with the command's path.
    fn all_arguments() -> Vec<(Vec<String>, clap::Arg)> {
        fn walk(
            command: &clap::Command,
            path: Vec<String>,
            out: &mut Vec<(Vec<String>, clap::Arg)>,
        ) {
            for arg in command.get_arguments() {
                out.push((path.clone(), arg.clone()));
            }
            for sub in command.get_subcommands() {
                let mut path = path.clone();
                path.push(sub.get_name().to_owned());
                walk(sub, path, out);
            }
        }
        let mut out = Vec::new();
        walk(&Cli::command(), Vec::new(), &mut out);
        out
    }

    /// Every argument whose value is a duration or a count has a range in
    /// `ranges`, its `--help` shows it, and its default is inside it; every
    /// range belongs to an argument.
    #[test]
    fn every_duration_and_count_setting_has_its_range_in_help() {
        use std::any::TypeId;
        let durations = [TypeId::of::<Duration>(), TypeId::of::<Option<Duration>>()];
        let counts = [
            TypeId::of::<u32>(),
            TypeId::of::<u64>(),
            TypeId::of::<i32>(),
            TypeId::of::<i16>(),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (path, arg) in all_arguments() {
            let value = arg.get_value_parser().type_id();
            let is_duration = durations.iter().any(|t| value == *t);
            let is_count = counts.iter().any(|t| value == *t);
            if !is_duration && !is_count {
                continue;
            }
            let key = setting_key(&arg).expect("a flag or a variable");
            let text = if is_duration {
                ranges::DURATIONS
                    .iter()
                    .find(|r| r.setting == key)
                    .map(|r| r.text())
            } else {
                ranges::COUNTS
                    .iter()
                    .find(|r| r.setting == key)
                    .map(|r| r.text())
            };
            let Some(text) = text else {
                panic!("{path:?} {key}: no range in config::ranges");
            };
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            assert!(
                help.contains(&text),
                "{key}: --help {help:?} does not say {text:?}"
            );
            seen.insert(key);
        }
        let listed: std::collections::BTreeSet<String> = ranges::DURATIONS
            .iter()
            .map(|r| r.setting.to_owned())
            .chain(ranges::COUNTS.iter().map(|r| r.setting.to_owned()))
            .collect();
        assert_eq!(seen, listed, "ranges without an argument, or the reverse");
    }

    /// docs/configuration.md gives every range: in the settings table (a
    /// variable) and in the table of "Ranges" with its reason.
    #[test]
    fn the_configuration_page_gives_every_range() {
        let page = include_str!("../../docs/configuration.md");
        let durations = ranges::DURATIONS.iter().map(|r| (r.setting, r.text()));
        let counts = ranges::COUNTS.iter().map(|r| (r.setting, r.text()));
        for (setting, text) in durations.chain(counts) {
            let name = format!("`{setting}`");
            let rows: Vec<&str> = page
                .lines()
                .filter(|line| {
                    line.starts_with('|')
                        && line
                            .split('|')
                            .nth(1)
                            .is_some_and(|cell| cell.contains(&name))
                })
                .collect();
            let expected = if setting.starts_with("--") { 1 } else { 2 };
            assert_eq!(rows.len(), expected, "{setting}: rows {rows:?}");
            for row in rows {
                assert!(
                    row.contains(&text),
                    "{setting}: {row:?} does not say {text:?}"
                );
            }
        }
    }

    /// The command line that sets `setting` to `value`, and what the
    /// command makes of it: settings validated as the binary would.
    fn outcome_of(setting: &str, value: &str) -> Result<(), ConfigError> {
        let flag = if setting.starts_with("--") {
            setting.to_owned()
        } else {
            format!("--{}", setting.to_lowercase().replace('_', "-"))
        };
        let command: Vec<&str> = match setting {
            "--spread" | "--active" | "--inactive" | "--poison" => vec!["seed"],
            "--batch-size" => vec![
                "republish",
                "--tenant",
                "00000000-0000-0000-0000-000000000001",
            ],
            _ => {
                let mut run = vec!["run"];
                run.extend_from_slice(&REQUIRED);
                run
            }
        };
        let mut args = command;
        // `--flag=value`: a value such as "-1s" is the flag's value, not a flag.
        let pair = format!("{flag}={value}");
        args.push(&pair);
        match parse(&args) {
            Ok(Command::Run(run)) => {
                let settings = Settings::from_args(run)?;
                // What start computes from them must not panic either.
                let _ = settings.stop_grace();
                let idle = settings.database.idle_in_transaction_timeout();
                assert!(
                    idle <= ranges::POSTGRES_MAX_TIMEOUT,
                    "{setting}={value}: {idle:?}"
                );
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(error) => Err(ConfigError::from_clap(&error)
                .unwrap_or_else(|| panic!("{setting}={value}: not a setting error: {error}"))),
        }
    }

    /// What a value outside a setting's range, or no value of its kind,
    /// must give: the setting named, with its range.
    fn assert_refused_with_range(setting: &str, value: &str, range: &str) {
        match outcome_of(setting, value) {
            Ok(()) => panic!("{setting}={value:?} accepted, outside {range}"),
            Err(error) => {
                assert_eq!(error.setting, setting, "{setting}={value:?}: {error}");
                assert!(
                    error.problem.contains(range),
                    "{setting}={value:?}: {error}"
                );
            }
        }
    }

    /// A value inside a setting's range starts, or meets a rule that spans
    /// settings (named, with the other setting): never a range error.
    fn assert_starts(setting: &str, value: &str, range: &str) {
        if let Err(error) = outcome_of(setting, value) {
            let rules = ["LIVENESS_WINDOW"];
            assert!(
                rules.contains(&error.setting.as_str()) && !error.problem.contains(range),
                "{setting}={value:?} is inside {range} but: {error}"
            );
        }
    }

    fn duration_text(duration: Duration) -> String {
        format!("{}ns", duration.as_nanos())
    }

    /// Every duration and count setting at its extremes: 0, 1, min-1,
    /// min, max-1, max, max+1, u64::MAX-ish, negative and garbage. Each is
    /// an exit-2 error naming the setting and its range, or settings that
    /// start; never a panic.
    #[test]
    fn every_setting_at_its_extremes_starts_or_names_its_range() {
        let unit = Duration::from_millis(1);
        for range in ranges::DURATIONS {
            let text = range.text();
            let inside = [range.min, range.min + unit, range.max - unit, range.max];
            for value in inside {
                assert_starts(range.setting, &duration_text(value), &text);
            }
            let mut outside = vec![
                range.max + unit,
                Duration::from_secs(10_000_000 * 86_400),
                Duration::from_secs(u64::MAX),
            ];
            if !range.min.is_zero() {
                outside.extend([Duration::ZERO, range.min - unit]);
            }
            for value in outside {
                assert_refused_with_range(range.setting, &duration_text(value), &text);
            }
            for value in [
                "10000000d",
                "18446744073709551615s",
                "18446744073709551616s",
                "-1s",
                "-5",
                "1",
                "soon",
                "",
                "1.5.2s",
                "NaN",
            ] {
                assert_refused_with_range(range.setting, value, &text);
            }
        }
        assert!(outcome_of("EXPIRATION_MAX_CLOCK_SKEW", "off").is_ok());
        for range in ranges::COUNTS {
            let text = range.text();
            for value in [range.min, range.min + 1, range.max - 1, range.max] {
                assert_starts(range.setting, &value.to_string(), &text);
            }
            let mut outside = vec![
                i128::from(range.max) + 1,
                i128::from(u64::MAX),
                i128::from(u64::MAX) + 1,
                -1,
                i128::MIN,
            ];
            if range.min > 0 {
                outside.extend([0, i128::from(range.min) - 1]);
            }
            for value in outside {
                assert_refused_with_range(range.setting, &value.to_string(), &text);
            }
            for value in [
                "abc",
                "",
                "1.5",
                "1e3",
                "0x10",
                "999999999999999999999999999999999999999999",
            ] {
                assert_refused_with_range(range.setting, value, &text);
            }
        }
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
        // Parsing takes the path as it is; the start-up check that follows
        // reads the file (`app`'s tests).
        let settings = with(
            &[
                &tls[..],
                &["--kafka-ssl-ca-location", "/nonexistent/ca.pem"],
            ]
            .concat(),
        )
        .unwrap()
        .kafka
        .unwrap();
        assert_eq!(
            settings.tls.unwrap().ca,
            Some(PathBuf::from("/nonexistent/ca.pem"))
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

        /// Any text for any duration or count setting: a value inside the
        /// range starts (or meets a rule that spans settings), anything
        /// else names the setting and its range; nothing panics.
        #[test]
        fn any_value_of_any_setting_starts_or_names_its_range(
            index in 0..ranges::DURATIONS.len() + ranges::COUNTS.len(),
            number in proptest::prop_oneof![
                0u64..2_000,
                0u64..100_000_000,
                proptest::num::u64::ANY,
            ],
            unit in proptest::sample::select(vec!["", "ns", "ms", "s", "m", "h", "d", "w", "y"]),
            garbage in "[ -~]{0,12}",
            form in 0..4u8,
        ) {
            let text = match form {
                0 => format!("{number}{unit}"),
                1 => format!("-{number}{unit}"),
                2 => garbage.clone(),
                _ => format!("{number}"),
            };
            if let Some(range) = ranges::DURATIONS.get(index) {
                let parsed = humantime::parse_duration(text.trim()).ok();
                let is_off = range.setting == "EXPIRATION_MAX_CLOCK_SKEW" && text.trim() == "off";
                match parsed {
                    Some(value) if range.contains(value) => assert_starts(range.setting, &text, &range.text()),
                    _ if is_off => proptest::prop_assert!(outcome_of(range.setting, &text).is_ok()),
                    _ => assert_refused_with_range(range.setting, &text, &range.text()),
                }
            } else {
                let range = ranges::COUNTS[index - ranges::DURATIONS.len()];
                // As the parser reads it: "-0" and "+5" are numbers too.
                let value = text.trim().parse::<i128>().ok().and_then(|v| u64::try_from(v).ok());
                match value {
                    Some(value) if range.contains(value) => assert_starts(range.setting, &text, &range.text()),
                    _ => assert_refused_with_range(range.setting, &text, &range.text()),
                }
            }
        }

        /// `Debug` of the parsed command line and of the settings (what a
        /// panic message or a `{:?}` in a log would print), and every
        /// setting error, hold neither the database password (in the URL
        /// raw, or percent-encoded, or `PGPASSWORD`) nor `KAFKA_SASL_PASSWORD`.
        #[test]
        fn no_debug_of_the_settings_holds_a_secret(
            secret in "[ -~é€]{10,30}",
            raw in proptest::bool::ANY,
        ) {
            let written = if raw { secret.clone() } else { crate::libpq::url::percent_encode(&secret) };
            let url = format!("postgres://app:{written}@db.example:5432/crm?sslmode=require");
            let direct = format!("postgres://app@db.example/crm?password={}", crate::libpq::url::percent_encode(&secret));
            let args = [
                "run", "--database-url", &url, "--database-direct-url", &direct,
                "--kafka-bootstrap-servers", "k:9092", "--kafka-sasl-mechanism", "SCRAM-SHA-512",
                "--kafka-sasl-username", "be", "--kafka-sasl-password", &secret,
                "--pgpassword", &secret,
            ];
            let forms = [secret.clone(), crate::libpq::url::percent_encode(&secret)];
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
