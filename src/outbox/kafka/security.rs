//! TLS and SASL on the worker's own broker connections, and what a
//! refused connection means in the words of the setting that fixes it.
//!
//! TLS is rustls on the pure-Rust graviola provider ([`crate::tls`]): no C.
//! The broker's certificate is verified against `KAFKA_SSL_CA_LOCATION`
//! (or the bundled webpki roots) and the host name of the address
//! connected to, always (SNI is that name too); an IP address is checked
//! against the certificate's IP addresses. The CA, certificate and key
//! files are read again for every new broker connection, so rotated files
//! are used without a restart.

use std::{path::Path, sync::Arc};

use rustls::{ClientConfig, client::WebPkiServerVerifier, pki_types::ServerName};
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};

use crate::{
    config::{ConfigError, KafkaSettings, KafkaTls, SaslMechanism, SecurityProtocol},
    tls::{TlsFileError, key_problem, load_certs, load_key, provider},
};

/// A Kafka connection that failed for a reason of security settings, in
/// one line that names the setting to check. Never holds key material or
/// a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecurityError {
    /// A CA, certificate or key file, read for a new connection.
    #[error("Kafka TLS: {0}")]
    File(#[from] TlsFileError),
    /// The TLS handshake failed, or the broker refused the connection right
    /// after it.
    #[error("Kafka TLS: {problem} for broker {broker} ({hint})")]
    Handshake {
        broker: String,
        problem: String,
        hint: String,
    },
    /// The broker refused the SASL credentials (or closed the connection
    /// during authentication).
    #[error(
        "Kafka SASL {mechanism} authentication failed at {servers} \
         (check KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD and KAFKA_SASL_MECHANISM)"
    )]
    Sasl {
        mechanism: &'static str,
        servers: String,
    },
    /// The broker does not offer the configured SASL mechanism.
    #[error(
        "Kafka SASL: broker {broker} does not offer {mechanism} \
         (offered: {offered}; check KAFKA_SASL_MECHANISM)"
    )]
    SaslMechanism {
        mechanism: &'static str,
        broker: String,
        offered: String,
    },
    /// A plaintext client whose broker closed the connection (or answered
    /// gibberish) at the first request: what a TLS listener does with
    /// plaintext.
    #[error(
        "broker {servers} closed the connection at the first request \
         (a TLS listener? KAFKA_SECURITY_PROTOCOL is {protocol}; use SSL or SASL_SSL for TLS)"
    )]
    NotPlaintext {
        servers: String,
        protocol: SecurityProtocol,
    },
}

pub(crate) fn mechanism_name(mechanism: SaslMechanism) -> &'static str {
    match mechanism {
        SaslMechanism::Plain => "PLAIN",
        SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
        SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
    }
}

pub(super) fn no_tls_answer(broker: &str, what: &str) -> SecurityError {
    SecurityError::Handshake {
        broker: broker.to_owned(),
        problem: format!("no TLS answer ({what})"),
        hint: "a PLAINTEXT or SASL_PLAINTEXT listener? check KAFKA_SECURITY_PROTOCOL".to_owned(),
    }
}

/// The rustls error inside an I/O error from tokio-rustls, if any.
pub(super) fn rustls_error(error: &std::io::Error) -> Option<&rustls::Error> {
    error.get_ref()?.downcast_ref::<rustls::Error>()
}

/// A TLS failure in the words of the settings that fix it.
pub(super) fn explain(error: &rustls::Error, broker: &str, tls: &KafkaTls) -> SecurityError {
    use rustls::{AlertDescription as Alert, CertificateError as Cert, Error as E};
    let roots = match &tls.ca {
        Some(path) => format!("KAFKA_SSL_CA_LOCATION {}", path.display()),
        None => "the bundled webpki roots (KAFKA_SSL_CA_LOCATION is not set)".to_owned(),
    };
    let (problem, hint) = match error {
        E::InvalidCertificate(Cert::UnknownIssuer) => (
            "certificate verify failed: not signed by a trusted CA".to_owned(),
            format!("check KAFKA_SSL_CA_LOCATION; trusted: {roots}"),
        ),
        E::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => (
            "certificate verify failed: not valid for the host name".to_owned(),
            "host names are always verified; check the host in KAFKA_BOOTSTRAP_SERVERS \
             and the broker's advertised listeners"
                .to_owned(),
        ),
        E::InvalidCertificate(Cert::Expired | Cert::ExpiredContext { .. }) => (
            "certificate verify failed: the broker's certificate has expired".to_owned(),
            "renew the broker's certificate; KAFKA_SSL_CA_LOCATION cannot help".to_owned(),
        ),
        E::InvalidCertificate(Cert::NotValidYet | Cert::NotValidYetContext { .. }) => (
            "certificate verify failed: the broker's certificate is not valid yet".to_owned(),
            "check the clocks".to_owned(),
        ),
        E::InvalidCertificate(other) => (
            format!("certificate verify failed: {other:?}"),
            format!("check KAFKA_SSL_CA_LOCATION; trusted: {roots}"),
        ),
        E::AlertReceived(
            Alert::CertificateRequired
            | Alert::HandshakeFailure
            | Alert::BadCertificate
            | Alert::CertificateUnknown,
        ) if tls.client.is_none() => (
            "the broker requires a client certificate".to_owned(),
            "set KAFKA_SSL_CERTIFICATE_LOCATION and KAFKA_SSL_KEY_LOCATION".to_owned(),
        ),
        E::AlertReceived(
            Alert::UnknownCA
            | Alert::BadCertificate
            | Alert::CertificateUnknown
            | Alert::HandshakeFailure
            | Alert::CertificateExpired
            | Alert::AccessDenied,
        ) => (
            "the broker refused the client certificate".to_owned(),
            "check KAFKA_SSL_CERTIFICATE_LOCATION and KAFKA_SSL_KEY_LOCATION".to_owned(),
        ),
        E::InvalidMessage(_) | E::InappropriateMessage { .. } => {
            return no_tls_answer(broker, &error.to_string());
        }
        other => (
            format!("TLS handshake failed ({other})"),
            "check KAFKA_SECURITY_PROTOCOL and KAFKA_SSL_CA_LOCATION".to_owned(),
        ),
    };
    SecurityError::Handshake {
        broker: broker.to_owned(),
        problem,
        hint,
    }
}

/// The check at start of the Kafka TLS settings, before anything
/// connects: the CPU can run the TLS library, and the files
/// [`client_config`] will read for every connection are readable and
/// well-formed. Its error names the setting to fix (an exit 2).
pub fn check(kafka: &KafkaSettings) -> Result<(), ConfigError> {
    let Some(tls) = &kafka.tls else {
        return Ok(());
    };
    if let Some(problem) = crate::tls::unsupported_cpu(kafka.security_protocol()) {
        return Err(ConfigError::new("KAFKA_SECURITY_PROTOCOL", problem));
    }
    client_config(tls)
        .map(drop)
        .map_err(|e| ConfigError::new(e.setting, format!("{}: {}", e.path.display(), e.problem)))
}

/// The rustls configuration for one new broker connection, the files read
/// now: the trusted CAs and the client certificate of `tls`, host names
/// always verified.
pub fn client_config(tls: &KafkaTls) -> Result<ClientConfig, TlsFileError> {
    let provider = provider();
    let roots = match &tls.ca {
        Some(path) => crate::tls::root_store_from("KAFKA_SSL_CA_LOCATION", path)?,
        None => crate::tls::bundled_roots(),
    };
    let ca_error = |problem: String| {
        TlsFileError::new(
            "KAFKA_SSL_CA_LOCATION",
            tls.ca
                .as_deref()
                .unwrap_or(Path::new("(bundled webpki roots)")),
            problem,
        )
    };
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| ca_error(format!("no usable root certificate ({e})")))?;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ca_error(format!("the TLS provider refuses TLS 1.2/1.3 ({e})")))?
        .with_webpki_verifier(verifier);
    match &tls.client {
        None => Ok(builder.with_no_client_auth()),
        Some(client) => {
            let certs = load_certs("KAFKA_SSL_CERTIFICATE_LOCATION", &client.cert)?;
            // The certificate's fault, named as such: rustls would refuse
            // a v1 leaf as a key that does not fit it.
            if certs
                .first()
                .is_some_and(|leaf| crate::tls::is_x509_v1(leaf))
            {
                return Err(TlsFileError::new(
                    "KAFKA_SSL_CERTIFICATE_LOCATION",
                    &client.cert,
                    crate::tls::X509_V1,
                ));
            }
            let key = load_key("KAFKA_SSL_KEY_LOCATION", &client.key)?;
            builder.with_client_auth_cert(certs, key).map_err(|e| {
                TlsFileError::new(
                    "KAFKA_SSL_KEY_LOCATION",
                    &client.key,
                    format!(
                        "cannot be used with KAFKA_SSL_CERTIFICATE_LOCATION ({})",
                        key_problem(&e)
                    ),
                )
            })
        }
    }
}

/// The TLS handshake over `tcp`, verifying the broker as `host` (`broker`
/// is `host:port`, for the message).
pub(super) async fn handshake(
    tcp: TcpStream,
    host: &str,
    broker: &str,
    tls: &KafkaTls,
) -> Result<TlsStream<TcpStream>, SecurityError> {
    // The files are read again for this connection (rotation).
    let config = client_config(tls)?;
    let name = ServerName::try_from(host.to_owned()).map_err(|_| SecurityError::Handshake {
        broker: broker.to_owned(),
        problem: "not a valid host name to verify".to_owned(),
        hint: "check KAFKA_BOOTSTRAP_SERVERS and the broker's advertised listeners".to_owned(),
    })?;
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|error| match rustls_error(&error) {
            Some(tls_error) => explain(tls_error, broker, tls),
            None => no_tls_answer(broker, &error.to_string()),
        })
}

/// The name of a connection step that timed out, with what a timeout
/// there usually means. A TLS listener reached in plaintext answers the
/// first request with a TLS alert, which reads as the length of a huge
/// response: under a plaintext protocol the name says so.
pub(super) fn stalled_step(protocol: SecurityProtocol, step: Step) -> &'static str {
    match (step, protocol.tls()) {
        (Step::Tcp, _) => "TCP connect",
        (Step::Tls, _) => {
            "TLS handshake (does the listener speak TLS? check KAFKA_SECURITY_PROTOCOL)"
        }
        (Step::Versions, false) => "first request (a TLS listener? check KAFKA_SECURITY_PROTOCOL)",
        (Step::Versions, true) => "first request",
        (Step::Sasl, _) => "SASL authentication",
    }
}

/// The steps of opening a broker connection, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    Tcp,
    Tls,
    Versions,
    Sasl,
}
