//! `KAFKA_*`: the publisher's connection to the brokers, its security
//! protocol, SASL and TLS. The flags are made into these settings, and
//! checked against each other, by `cli` ([`super::KafkaArgs`]).

use std::{fmt, path::PathBuf, time::Duration};

use super::defaults;

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
    /// Bounds one Kafka call on this side: a metadata read, or one
    /// partition's produce request (`outbox::Timing::request_timeout`).
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
