//! The command line: the commands, each with the groups of settings it
//! uses, and the two groups that need a step after parsing (a required
//! URL, SASL credentials that go together).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::{
    Compression, ConfigError, DatabaseSettings, EventSettings, ExpirySettings, HttpSettings,
    KafkaClientCert, KafkaSettings, KafkaTls, Pooler, PublisherSettings, SaslMechanism,
    SaslSettings, SecurityProtocol, SeedSettings, ShutdownSettings,
    catalog::*,
    parse::{self, BootstrapServers},
    secret::Secret,
    setting::{Declared, flatten, group, named},
};
use crate::libpq::{
    self, DatabaseUrl,
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
    #[arg(long = "expired-from", value_parser = named(parse::instant))]
    pub expired_from: Option<chrono::DateTime<chrono::Utc>>,
    /// Replay bookings expired before this time (RFC 3339).
    #[arg(long = "expired-to", value_parser = named(parse::instant))]
    pub expired_to: Option<chrono::DateTime<chrono::Utc>>,
    /// Print the events (one JSON line each on stdout) instead of enqueuing them.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    #[command(flatten)]
    pub batch: RepublishBatch,
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
    #[command(flatten)]
    pub roles: RoleArgs,
}

group! {
    /// `republish`'s batches.
    #[derive(Debug, Clone)]
    pub struct RepublishBatch {
        pub batch_size: u32 = REPUBLISH_BATCH_SIZE,
    }
}

group! {
    /// Which loops `run` starts; [`super::Settings::from_args`] wants one
    /// at least.
    #[derive(Debug, Clone)]
    pub struct RoleArgs {
        pub no_worker: bool = NO_WORKER,
        pub no_publisher: bool = NO_PUBLISHER,
    }
}

group! {
    /// The database flags; the URL is required by every command, which
    /// [`Self::settings`] checks so the error is one line like the others.
    #[derive(Debug, Clone)]
    pub struct DatabaseArgs {
        pub database_url: Option<PgUrl> = DATABASE_URL,
        pub database_pool_size: u32 = DATABASE_POOL_SIZE,
        pub database_connect_timeout: std::time::Duration = DATABASE_CONNECT_TIMEOUT,
        pub database_statement_timeout: std::time::Duration = DATABASE_STATEMENT_TIMEOUT,
        pub database_pooler: Pooler = DATABASE_POOLER,
        pub database_direct_url: Option<PgUrl> = DATABASE_DIRECT_URL,
        /// libpq's environment (`PGHOST`, `PGPASSWORD`, `PGSSLMODE`, ...): each
        /// where the URLs leave its parameter out.
        pub libpq: LibpqArgs = flatten(),
    }
}

group! {
    /// libpq's variables, each the default of one URL parameter; what they
    /// mean is [`crate::libpq`]'s.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct LibpqArgs: Default {
        pub host: Option<String> = PGHOST,
        pub port: Option<String> = PGPORT,
        pub dbname: Option<String> = PGDATABASE,
        pub user: Option<String> = PGUSER,
        pub password: Option<Secret> = PGPASSWORD,
        pub passfile: Option<PathBuf> = PGPASSFILE,
        pub sslmode: Option<SslMode> = PGSSLMODE,
        pub sslrootcert: Option<String> = PGSSLROOTCERT,
        pub sslcert: Option<String> = PGSSLCERT,
        pub sslkey: Option<String> = PGSSLKEY,
        pub appname: Option<String> = PGAPPNAME,
        pub connect_timeout: Option<String> = PGCONNECT_TIMEOUT,
    }
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

impl DatabaseArgs {
    /// The settings, libpq's environment applied to both URLs.
    pub fn settings(self) -> Result<DatabaseSettings, ConfigError> {
        let env = self.libpq.env();
        let url = self.database_url.ok_or_else(|| {
            ConfigError::new(DATABASE_URL.name(), "is required (a postgres:// URL)")
        })?;
        let url = DatabaseUrl::with_env(url, &env, DATABASE_URL.name())?;
        let direct_url = self
            .database_direct_url
            .map(|direct| DatabaseUrl::with_env(direct, &env, DATABASE_DIRECT_URL.name()))
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

group! {
    /// The Kafka flags; [`super::Settings::from_args`] makes them a
    /// [`super::KafkaSettings`] when the publisher runs.
    #[derive(Debug, Clone)]
    pub struct KafkaArgs {
        pub kafka_bootstrap_servers: Option<BootstrapServers> = KAFKA_BOOTSTRAP_SERVERS,
        pub kafka_client_id: String = KAFKA_CLIENT_ID,
        pub kafka_request_timeout: std::time::Duration = KAFKA_REQUEST_TIMEOUT,
        pub kafka_create_topic: bool = KAFKA_CREATE_TOPIC,
        pub kafka_topic_partitions: i32 = KAFKA_TOPIC_PARTITIONS,
        pub kafka_replication_factor: i16 = KAFKA_REPLICATION_FACTOR,
        pub kafka_compression: Compression = KAFKA_COMPRESSION,
        pub kafka_sasl_mechanism: Option<SaslMechanism> = KAFKA_SASL_MECHANISM,
        pub kafka_sasl_username: Option<String> = KAFKA_SASL_USERNAME,
        pub kafka_sasl_password: Option<Secret> = KAFKA_SASL_PASSWORD,
        pub kafka_security_protocol: Option<SecurityProtocol> = KAFKA_SECURITY_PROTOCOL,
        pub tls: KafkaTlsArgs = flatten(),
    }
}

group! {
    /// The TLS files of `KAFKA_SECURITY_PROTOCOL=SSL` or `SASL_SSL` (PEM),
    /// read again for every new connection.
    #[derive(Debug, Clone, Default)]
    pub struct KafkaTlsArgs {
        pub kafka_ssl_ca_location: Option<PathBuf> = KAFKA_SSL_CA_LOCATION,
        pub kafka_ssl_certificate_location: Option<PathBuf> = KAFKA_SSL_CERTIFICATE_LOCATION,
        pub kafka_ssl_key_location: Option<PathBuf> = KAFKA_SSL_KEY_LOCATION,
    }
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
                KAFKA_BOOTSTRAP_SERVERS.name(),
                "is required for run (host:port,host:port)",
            )
        })?
        .0;
    let sasl = match args.kafka_sasl_mechanism {
        None => None,
        Some(mechanism) => Some(SaslSettings {
            mechanism,
            username: args
                .kafka_sasl_username
                .ok_or_else(|| required_with(&KAFKA_SASL_USERNAME, &KAFKA_SASL_MECHANISM))?,
            password: args
                .kafka_sasl_password
                .map(Secret::into_inner)
                .ok_or_else(|| required_with(&KAFKA_SASL_PASSWORD, &KAFKA_SASL_MECHANISM))?,
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
/// before the setting existed) and `PLAINTEXT` otherwise. Set, it must agree with the mechanism: librdkafka silently
/// ignores a mechanism under `PLAINTEXT` or `SSL`, which hides a
/// misconfiguration, so here that is an error.
fn security_protocol(args: &KafkaArgs) -> Result<SecurityProtocol, ConfigError> {
    let mechanism = args.kafka_sasl_mechanism;
    let Some(protocol) = args.kafka_security_protocol else {
        return Ok(if mechanism.is_some() {
            SecurityProtocol::SaslPlaintext
        } else {
            SecurityProtocol::Plaintext
        });
    };
    match (protocol.sasl(), mechanism) {
        (true, None) => Err(ConfigError::new(
            KAFKA_SASL_MECHANISM.name(),
            format!(
                "is required with {}={protocol}",
                KAFKA_SECURITY_PROTOCOL.name()
            ),
        )),
        (false, Some(_)) => Err(ConfigError::new(
            KAFKA_SASL_MECHANISM.name(),
            format!(
                "is set, but {}={protocol} uses no SASL (use SASL_SSL or SASL_PLAINTEXT, or \
                 unset {})",
                KAFKA_SECURITY_PROTOCOL.name(),
                KAFKA_SASL_MECHANISM.name()
            ),
        )),
        _ => Ok(protocol),
    }
}

/// The TLS settings of `SSL` and `SASL_SSL`. The files are checked at
/// start by `outbox::kafka::security::check` (and read again for every
/// connection).
fn kafka_tls(
    args: &KafkaTlsArgs,
    protocol: SecurityProtocol,
) -> Result<Option<KafkaTls>, ConfigError> {
    if !protocol.tls() {
        let given = [
            (KAFKA_SSL_CA_LOCATION, &args.kafka_ssl_ca_location),
            (
                KAFKA_SSL_CERTIFICATE_LOCATION,
                &args.kafka_ssl_certificate_location,
            ),
            (KAFKA_SSL_KEY_LOCATION, &args.kafka_ssl_key_location),
        ];
        if let Some((setting, _)) = given.iter().find(|(_, value)| value.is_some()) {
            return Err(ConfigError::new(
                setting.name(),
                format!(
                    "is set, but {}={protocol} uses no TLS (use SSL or SASL_SSL)",
                    KAFKA_SECURITY_PROTOCOL.name()
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
            return Err(required_with(
                &KAFKA_SSL_KEY_LOCATION,
                &KAFKA_SSL_CERTIFICATE_LOCATION,
            ));
        }
        (None, Some(_)) => {
            return Err(required_with(
                &KAFKA_SSL_CERTIFICATE_LOCATION,
                &KAFKA_SSL_KEY_LOCATION,
            ));
        }
    };
    let tls = KafkaTls {
        ca: args.kafka_ssl_ca_location.clone(),
        client,
    };
    Ok(Some(tls))
}

/// `setting` is missing where `other` needs it.
fn required_with(setting: &dyn Declared, other: &dyn Declared) -> ConfigError {
    ConfigError::new(setting.name(), format!("is required with {}", other.name()))
}
