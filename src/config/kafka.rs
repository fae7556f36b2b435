//! `KAFKA_*`: the publisher's connection to the brokers, its security
//! protocol, SASL and TLS, checked against each other.

use std::{fmt, path::PathBuf, time::Duration};

use super::{ConfigError, KafkaArgs, KafkaTlsArgs, defaults, secret};

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
    /// Bounds one whole produce (see [`super::Settings::stop_grace`]).
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
    /// Settings for `bootstrap_servers` alone: `PLAINTEXT`, no topic
    /// creation, the defaults of every other setting.
    pub fn new(bootstrap_servers: Vec<String>) -> Self {
        Self {
            bootstrap_servers,
            client_id: defaults::KAFKA_CLIENT_ID.to_owned(),
            request_timeout: defaults::KAFKA_REQUEST_TIMEOUT,
            create_topic: false,
            topic_partitions: defaults::KAFKA_TOPIC_PARTITIONS,
            replication_factor: defaults::KAFKA_REPLICATION_FACTOR,
            compression: defaults::KAFKA_COMPRESSION,
            sasl: None,
            tls: None,
        }
    }

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

/// Builds the Kafka group: the servers are required for the publisher,
/// and a SASL mechanism needs its username and password.
pub(super) fn kafka_settings(args: KafkaArgs) -> Result<KafkaSettings, ConfigError> {
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
