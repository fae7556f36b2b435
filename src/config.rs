//! Typed settings, read from flags or the environment variables of the
//! same name, validated once at start. Values are taken as text and parsed
//! here so every mistake becomes one [`ConfigError`] naming the setting.

use std::{fmt, net::SocketAddr, time::Duration};

use clap::{Args, Parser, Subcommand};

/// Named defaults (spec §9 and the operator documentation).
pub mod defaults {
    pub const KAFKA_TOPIC: &str = "pin.crm.booking-expired.v1";
    pub const EXPIRATION_INTERVAL: &str = "60s";
    pub const EXPIRATION_BATCH_SIZE: &str = "200";
    pub const EXPIRATION_MAX_BATCHES_PER_CYCLE: &str = "1000";
    pub const EXPIRATION_CYCLE_BUDGET: &str = "30s";
    pub const EXPIRATION_MAX_CLOCK_SKEW: &str = "2s";
    pub const METRICS_ADDR: &str = "127.0.0.1:9464";
    pub const DATABASE_POOL_SIZE: &str = "8";
    pub const DATABASE_CONNECT_TIMEOUT: &str = "5s";
    pub const DATABASE_STATEMENT_TIMEOUT: &str = "30s";
    pub const SHUTDOWN_GRACE: &str = "10s";
    pub const OUTBOX_BATCH_SIZE: &str = "500";
    pub const OUTBOX_POLL_INTERVAL: &str = "1s";
    pub const OUTBOX_CONCURRENCY: &str = "2";
    pub const OUTBOX_RETENTION: &str = "24h";
    pub const KAFKA_REQUEST_TIMEOUT: &str = "10s";
    pub const KAFKA_CLIENT_ID: &str = "booking-expiration";
    pub const KAFKA_TOPIC_PARTITIONS: &str = "3";
    pub const KAFKA_REPLICATION_FACTOR: &str = "1";
    pub const KAFKA_COMPRESSION: &str = "none";
    pub const CE_SOURCE: &str = crate::events::DEFAULT_SOURCE;
}

/// A setting that is missing or malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {problem}")]
pub struct ConfigError {
    /// The environment variable name of the setting.
    pub setting: &'static str,
    pub problem: String,
}

impl ConfigError {
    fn new(setting: &'static str, problem: impl Into<String>) -> Self {
        Self {
            setting,
            problem: problem.into(),
        }
    }
}

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
    },
    /// Run the expiry worker, the outbox publisher and the HTTP endpoints until SIGTERM/SIGINT.
    Run {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        expiry: ExpiryArgs,
        #[command(flatten)]
        kafka: KafkaArgs,
        #[command(flatten)]
        publisher: PublisherArgs,
        /// HTTP address for /metrics, /healthz and /readyz.
        #[arg(long, env = "METRICS_ADDR", default_value = defaults::METRICS_ADDR)]
        metrics_addr: String,
        /// /healthz fails when no cycle succeeded for this long.
        #[arg(long, env = "LIVENESS_WINDOW", default_value = "5m")]
        liveness_window: String,
        /// Run the publisher only (no expiry cycles).
        #[arg(long, env = "NO_WORKER", default_value_t = false)]
        no_worker: bool,
        /// Run the expiry worker only (outbox rows wait for another instance).
        #[arg(long, env = "NO_PUBLISHER", default_value_t = false)]
        no_publisher: bool,
    },
    /// Run exactly one expiry cycle (no publishing) and print its result as a JSON line.
    Once {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        expiry: ExpiryArgs,
    },
    /// Show backlog, outbox lag and poison rows without changing anything.
    Status {
        #[command(flatten)]
        database: DatabaseArgs,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Insert synthetic bookings (demo, benchmarks, load tests).
    Seed {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        seed: SeedArgs,
    },
}

#[derive(Debug, Clone, Args)]
pub struct SeedArgs {
    /// Active bookings (Reserved, AwaitingPayment and Booked in turn).
    #[arg(long, default_value = "10000")]
    pub active: String,
    /// Share of the active bookings already due (0.0-1.0).
    #[arg(long, default_value = "0.2")]
    pub due_fraction: String,
    /// Terminal or inactive rows beside them.
    #[arg(long, default_value = "0")]
    pub inactive: String,
    /// Due legacy rows without deal_id (poison).
    #[arg(long, default_value = "0")]
    pub poison: String,
    /// The not-yet-due deadlines are spread over this span from now.
    #[arg(long, default_value = "10m")]
    pub spread: String,
}

/// A validated `seed` request.
#[derive(Debug, Clone)]
pub struct SeedSettings {
    pub active: u64,
    pub due_fraction: f64,
    pub inactive: u64,
    pub poison: u64,
    pub spread: Duration,
}

impl SeedArgs {
    pub fn settings(&self) -> Result<SeedSettings, ConfigError> {
        let count = |setting: &'static str, raw: &str| -> Result<u64, ConfigError> {
            raw.trim().parse::<u64>().map_err(|_| {
                ConfigError::new(setting, format!("{raw:?} is not a whole number >= 0"))
            })
        };
        let due_fraction: f64 = self
            .due_fraction
            .trim()
            .parse()
            .ok()
            .filter(|f: &f64| (0.0..=1.0).contains(f))
            .ok_or_else(|| {
                ConfigError::new(
                    "--due-fraction",
                    format!("{:?} is not between 0 and 1", self.due_fraction),
                )
            })?;
        Ok(SeedSettings {
            active: count("--active", &self.active)?,
            due_fraction,
            inactive: count("--inactive", &self.inactive)?,
            poison: count("--poison", &self.poison)?,
            spread: parse_duration("--spread", &self.spread)?,
        })
    }
}

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL (postgres://user:password@host:port/database).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Maximum connections in the pool.
    #[arg(long, env = "DATABASE_POOL_SIZE", default_value = defaults::DATABASE_POOL_SIZE)]
    pub database_pool_size: String,
    /// Time to wait for a connection.
    #[arg(long, env = "DATABASE_CONNECT_TIMEOUT", default_value = defaults::DATABASE_CONNECT_TIMEOUT)]
    pub database_connect_timeout: String,
    /// Server-side limit of one statement.
    #[arg(long, env = "DATABASE_STATEMENT_TIMEOUT", default_value = defaults::DATABASE_STATEMENT_TIMEOUT)]
    pub database_statement_timeout: String,
}

#[derive(Debug, Clone, Args)]
pub struct ExpiryArgs {
    /// Cycle period (humantime: 500ms, 1s, 60s).
    #[arg(long, env = "EXPIRATION_INTERVAL", default_value = defaults::EXPIRATION_INTERVAL)]
    pub expiration_interval: String,
    /// Rows per phase per transaction.
    #[arg(long, env = "EXPIRATION_BATCH_SIZE", default_value = defaults::EXPIRATION_BATCH_SIZE)]
    pub expiration_batch_size: String,
    /// Batches per phase per cycle while batches come back full (1 = one batch per cycle).
    #[arg(long, env = "EXPIRATION_MAX_BATCHES_PER_CYCLE", default_value = defaults::EXPIRATION_MAX_BATCHES_PER_CYCLE)]
    pub expiration_max_batches_per_cycle: String,
    /// No new batch starts after a cycle ran this long.
    #[arg(long, env = "EXPIRATION_CYCLE_BUDGET", default_value = defaults::EXPIRATION_CYCLE_BUDGET)]
    pub expiration_cycle_budget: String,
    /// as_of never runs ahead of the database clock by more than this ("off" disables the check).
    #[arg(long, env = "EXPIRATION_MAX_CLOCK_SKEW", default_value = defaults::EXPIRATION_MAX_CLOCK_SKEW)]
    pub expiration_max_clock_skew: String,
    /// On shutdown, how long an in-flight batch may take before it is rolled back.
    #[arg(long, env = "SHUTDOWN_GRACE", default_value = defaults::SHUTDOWN_GRACE)]
    pub shutdown_grace: String,
    /// `ce_source` header of the events.
    #[arg(long, env = "CE_SOURCE", default_value = defaults::CE_SOURCE)]
    pub ce_source: String,
    /// Topic written on outbox rows.
    #[arg(long, env = "KAFKA_TOPIC", default_value = defaults::KAFKA_TOPIC)]
    pub kafka_topic: String,
}

#[derive(Debug, Clone, Args)]
pub struct KafkaArgs {
    /// Comma-separated host:port list.
    #[arg(long, env = "KAFKA_BOOTSTRAP_SERVERS")]
    pub kafka_bootstrap_servers: Option<String>,
    /// Client id sent to the broker.
    #[arg(long, env = "KAFKA_CLIENT_ID", default_value = defaults::KAFKA_CLIENT_ID)]
    pub kafka_client_id: String,
    /// Limit of one metadata or produce exchange, retries included.
    #[arg(long, env = "KAFKA_REQUEST_TIMEOUT", default_value = defaults::KAFKA_REQUEST_TIMEOUT)]
    pub kafka_request_timeout: String,
    /// Create the topic when it does not exist (otherwise a missing topic is an error).
    #[arg(long, env = "KAFKA_CREATE_TOPIC", default_value_t = false)]
    pub kafka_create_topic: bool,
    /// Partitions of a topic created by KAFKA_CREATE_TOPIC.
    #[arg(long, env = "KAFKA_TOPIC_PARTITIONS", default_value = defaults::KAFKA_TOPIC_PARTITIONS)]
    pub kafka_topic_partitions: String,
    /// Replication factor of a topic created by KAFKA_CREATE_TOPIC.
    #[arg(long, env = "KAFKA_REPLICATION_FACTOR", default_value = defaults::KAFKA_REPLICATION_FACTOR)]
    pub kafka_replication_factor: String,
    /// none, gzip or snappy (lz4/zstd with their opt-in features).
    #[arg(long, env = "KAFKA_COMPRESSION", default_value = defaults::KAFKA_COMPRESSION)]
    pub kafka_compression: String,
    /// PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; unset = no SASL.
    #[arg(long, env = "KAFKA_SASL_MECHANISM")]
    pub kafka_sasl_mechanism: Option<String>,
    #[arg(long, env = "KAFKA_SASL_USERNAME")]
    pub kafka_sasl_username: Option<String>,
    #[arg(long, env = "KAFKA_SASL_PASSWORD", hide_env_values = true)]
    pub kafka_sasl_password: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct PublisherArgs {
    /// Outbox rows claimed per transaction.
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value = defaults::OUTBOX_BATCH_SIZE)]
    pub outbox_batch_size: String,
    /// Polling period when no commit notification arrives.
    #[arg(long, env = "OUTBOX_POLL_INTERVAL", default_value = defaults::OUTBOX_POLL_INTERVAL)]
    pub outbox_poll_interval: String,
    /// How long published rows are kept (0s = delete right after publishing).
    #[arg(long, env = "OUTBOX_RETENTION", default_value = defaults::OUTBOX_RETENTION)]
    pub outbox_retention: String,
    /// Batches in flight at once while a backlog drains (each its own
    /// transaction and pooled connection; SKIP LOCKED keeps them disjoint).
    #[arg(long, env = "OUTBOX_CONCURRENCY", default_value = defaults::OUTBOX_CONCURRENCY)]
    pub outbox_concurrency: String,
}

/// A PostgreSQL URL that never prints its password.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        const SETTING: &str = "DATABASE_URL";
        let raw = raw.trim();
        if raw.is_empty() {
            return Err(ConfigError::new(SETTING, "is empty"));
        }
        // url::ParseError never echoes the input, so no password leaks here.
        let url = url::Url::parse(raw)
            .map_err(|e| ConfigError::new(SETTING, format!("not a valid URL ({e})")))?;
        if !matches!(url.scheme(), "postgres" | "postgresql") {
            return Err(ConfigError::new(
                SETTING,
                format!(
                    "scheme must be postgres:// or postgresql://, not {}://",
                    url.scheme()
                ),
            ));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(ConfigError::new(SETTING, "has no host"));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The full URL, password included: only for connecting.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with the password replaced, for logs.
    pub fn redacted(&self) -> String {
        match url::Url::parse(&self.0) {
            Ok(mut url) => {
                if url.password().is_some() {
                    let _ = url.set_password(Some("***"));
                }
                url.to_string()
            }
            Err(_) => "<invalid>".to_owned(),
        }
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

#[derive(Debug, Clone)]
pub struct DatabaseSettings {
    pub url: DatabaseUrl,
    pub pool_size: u32,
    pub connect_timeout: Duration,
    pub statement_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct ExpirySettings {
    pub interval: Duration,
    pub batch_size: u32,
    pub max_batches_per_cycle: u32,
    pub cycle_budget: Duration,
    /// `None`: as_of is the local clock, unchecked.
    pub max_clock_skew: Option<Duration>,
    pub shutdown_grace: Duration,
    pub ce_source: String,
    pub topic: String,
}

/// SASL mechanism and credentials.
#[derive(Clone)]
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

#[derive(Debug, Clone)]
pub struct KafkaSettings {
    pub bootstrap_servers: Vec<String>,
    pub client_id: String,
    pub request_timeout: Duration,
    pub create_topic: bool,
    pub topic_partitions: i32,
    pub replication_factor: i16,
    pub compression: Compression,
    pub sasl: Option<SaslSettings>,
}

#[derive(Debug, Clone)]
pub struct PublisherSettings {
    pub batch_size: u32,
    pub poll_interval: Duration,
    pub retention: Duration,
    /// Batches in flight at once while a backlog drains (at least 1).
    pub concurrency: u32,
}

/// Parses a humantime duration (`500ms`, `1s`, `60s`, `2m`).
pub fn parse_duration(setting: &'static str, raw: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(raw.trim()).map_err(|e| {
        ConfigError::new(
            setting,
            format!("{raw:?} is not a duration like 500ms, 1s or 60s ({e})"),
        )
    })
}

fn parse_positive_duration(setting: &'static str, raw: &str) -> Result<Duration, ConfigError> {
    let duration = parse_duration(setting, raw)?;
    if duration.is_zero() {
        return Err(ConfigError::new(setting, "must be greater than zero"));
    }
    Ok(duration)
}

/// Parses a positive integer no larger than `max`.
pub fn parse_count(setting: &'static str, raw: &str, max: u64) -> Result<u64, ConfigError> {
    let value: i128 = raw
        .trim()
        .parse()
        .map_err(|_| ConfigError::new(setting, format!("{raw:?} is not a whole number")))?;
    if value < 1 {
        return Err(ConfigError::new(
            setting,
            format!("must be at least 1, got {value}"),
        ));
    }
    if value > i128::from(max) {
        return Err(ConfigError::new(
            setting,
            format!("must be at most {max}, got {value}"),
        ));
    }
    Ok(value as u64)
}

impl DatabaseArgs {
    pub fn settings(&self) -> Result<DatabaseSettings, ConfigError> {
        let raw = self
            .database_url
            .as_deref()
            .ok_or_else(|| ConfigError::new("DATABASE_URL", "is required (a postgres:// URL)"))?;
        Ok(DatabaseSettings {
            url: DatabaseUrl::parse(raw)?,
            pool_size: parse_count("DATABASE_POOL_SIZE", &self.database_pool_size, 1000)? as u32,
            connect_timeout: parse_positive_duration(
                "DATABASE_CONNECT_TIMEOUT",
                &self.database_connect_timeout,
            )?,
            statement_timeout: parse_positive_duration(
                "DATABASE_STATEMENT_TIMEOUT",
                &self.database_statement_timeout,
            )?,
        })
    }
}

impl ExpiryArgs {
    pub fn settings(&self) -> Result<ExpirySettings, ConfigError> {
        let topic = self.kafka_topic.trim();
        if topic.is_empty() {
            return Err(ConfigError::new("KAFKA_TOPIC", "is empty"));
        }
        Ok(ExpirySettings {
            interval: parse_positive_duration("EXPIRATION_INTERVAL", &self.expiration_interval)?,
            batch_size: parse_count(
                "EXPIRATION_BATCH_SIZE",
                &self.expiration_batch_size,
                100_000,
            )? as u32,
            max_batches_per_cycle: parse_count(
                "EXPIRATION_MAX_BATCHES_PER_CYCLE",
                &self.expiration_max_batches_per_cycle,
                1_000_000,
            )? as u32,
            cycle_budget: parse_positive_duration(
                "EXPIRATION_CYCLE_BUDGET",
                &self.expiration_cycle_budget,
            )?,
            max_clock_skew: match self.expiration_max_clock_skew.trim() {
                "off" => None,
                raw => Some(parse_duration("EXPIRATION_MAX_CLOCK_SKEW", raw)?),
            },
            shutdown_grace: parse_duration("SHUTDOWN_GRACE", &self.shutdown_grace)?,
            ce_source: self.ce_source.clone(),
            topic: topic.to_owned(),
        })
    }
}

impl KafkaArgs {
    pub fn settings(&self) -> Result<KafkaSettings, ConfigError> {
        const SERVERS: &str = "KAFKA_BOOTSTRAP_SERVERS";
        let raw = self.kafka_bootstrap_servers.as_deref().ok_or_else(|| {
            ConfigError::new(SERVERS, "is required for run (host:port,host:port)")
        })?;
        let bootstrap_servers = raw
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|server| {
                let (host, port) = server.rsplit_once(':').ok_or_else(|| {
                    ConfigError::new(SERVERS, format!("{server:?} is not host:port"))
                })?;
                if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                    return Err(ConfigError::new(
                        SERVERS,
                        format!("{server:?} is not host:port"),
                    ));
                }
                Ok(server.to_owned())
            })
            .collect::<Result<Vec<_>, _>>()?;
        if bootstrap_servers.is_empty() {
            return Err(ConfigError::new(SERVERS, "lists no server"));
        }
        let compression = match self.kafka_compression.trim().to_ascii_lowercase().as_str() {
            "none" | "" => Compression::None,
            "gzip" => Compression::Gzip,
            "snappy" => Compression::Snappy,
            #[cfg(feature = "kafka-lz4")]
            "lz4" => Compression::Lz4,
            #[cfg(feature = "kafka-zstd")]
            "zstd" => Compression::Zstd,
            other => {
                return Err(ConfigError::new(
                    "KAFKA_COMPRESSION",
                    format!(
                        "{other:?} is not none, gzip or snappy (lz4/zstd need their build features)"
                    ),
                ));
            }
        };
        let sasl = match self.kafka_sasl_mechanism.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(mechanism) => {
                let mechanism = match mechanism.to_ascii_uppercase().as_str() {
                    "PLAIN" => SaslMechanism::Plain,
                    "SCRAM-SHA-256" => SaslMechanism::ScramSha256,
                    "SCRAM-SHA-512" => SaslMechanism::ScramSha512,
                    _ => {
                        return Err(ConfigError::new(
                            "KAFKA_SASL_MECHANISM",
                            format!("{mechanism:?} is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
                        ));
                    }
                };
                Some(SaslSettings {
                    mechanism,
                    username: self.kafka_sasl_username.clone().ok_or_else(|| {
                        ConfigError::new(
                            "KAFKA_SASL_USERNAME",
                            "is required with KAFKA_SASL_MECHANISM",
                        )
                    })?,
                    password: self.kafka_sasl_password.clone().ok_or_else(|| {
                        ConfigError::new(
                            "KAFKA_SASL_PASSWORD",
                            "is required with KAFKA_SASL_MECHANISM",
                        )
                    })?,
                })
            }
        };
        Ok(KafkaSettings {
            bootstrap_servers,
            client_id: self.kafka_client_id.clone(),
            request_timeout: parse_positive_duration(
                "KAFKA_REQUEST_TIMEOUT",
                &self.kafka_request_timeout,
            )?,
            create_topic: self.kafka_create_topic,
            topic_partitions: parse_count(
                "KAFKA_TOPIC_PARTITIONS",
                &self.kafka_topic_partitions,
                10_000,
            )? as i32,
            replication_factor: parse_count(
                "KAFKA_REPLICATION_FACTOR",
                &self.kafka_replication_factor,
                32,
            )? as i16,
            compression,
            sasl,
        })
    }
}

impl PublisherArgs {
    pub fn settings(&self) -> Result<PublisherSettings, ConfigError> {
        Ok(PublisherSettings {
            batch_size: parse_count("OUTBOX_BATCH_SIZE", &self.outbox_batch_size, 10_000)? as u32,
            poll_interval: parse_positive_duration(
                "OUTBOX_POLL_INTERVAL",
                &self.outbox_poll_interval,
            )?,
            retention: parse_duration("OUTBOX_RETENTION", &self.outbox_retention)?,
            concurrency: parse_count("OUTBOX_CONCURRENCY", &self.outbox_concurrency, 16)? as u32,
        })
    }
}

/// Parses `METRICS_ADDR`.
pub fn parse_socket_addr(setting: &'static str, raw: &str) -> Result<SocketAddr, ConfigError> {
    raw.trim().parse().map_err(|_| {
        ConfigError::new(
            setting,
            format!("{raw:?} is not an address like 127.0.0.1:9464"),
        )
    })
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

    #[test]
    fn counts_and_durations_name_their_setting() {
        assert_eq!(parse_count("EXPIRATION_BATCH_SIZE", "200", 1000), Ok(200));
        for bad in ["0", "-5", "abc", "", "1.5", "100000000000"] {
            let err = parse_count("EXPIRATION_BATCH_SIZE", bad, 1000).unwrap_err();
            assert_eq!(err.setting, "EXPIRATION_BATCH_SIZE", "{bad}");
        }
        assert_eq!(
            parse_duration("EXPIRATION_INTERVAL", "500ms"),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(
            parse_duration("EXPIRATION_INTERVAL", "60s"),
            Ok(Duration::from_secs(60))
        );
        assert!(parse_duration("EXPIRATION_INTERVAL", "soon").is_err());
        assert!(parse_positive_duration("EXPIRATION_INTERVAL", "0s").is_err());
    }
}
