//! What a failed Kafka connection means, in the words of the setting
//! that fixes it.

use super::TlsBridge;
use crate::{
    config::{KafkaSettings, KafkaTls, SaslMechanism, SecurityProtocol},
    tls::TlsFileError,
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
    /// The local bridge could not start.
    #[error("Kafka TLS: cannot start the in-process TLS bridge ({0})")]
    Bridge(String),
    /// TCP to the broker failed (before any TLS).
    #[error("cannot connect to broker {broker} ({problem})")]
    Connect { broker: String, problem: String },
    /// The TLS handshake failed, or the broker refused the connection right
    /// after it.
    #[error("Kafka TLS: {problem} for broker {broker} ({hint})")]
    Handshake {
        broker: String,
        problem: String,
        hint: String,
    },
    /// The broker refused the SASL credentials (or, seen from the
    /// bridge, closed the connection during authentication).
    #[error(
        "Kafka SASL {mechanism} authentication failed at {servers} \
         (check KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD and KAFKA_SASL_MECHANISM)"
    )]
    Sasl {
        mechanism: &'static str,
        servers: String,
    },
    /// A plaintext client whose broker closed the connection at the first
    /// request: what a TLS listener does with plaintext.
    #[error(
        "broker {servers} closed the connection at the first request \
         (a TLS listener? KAFKA_SECURITY_PROTOCOL is {protocol}; use SSL or SASL_SSL for TLS)"
    )]
    NotPlaintext {
        servers: String,
        protocol: SecurityProtocol,
    },
}

/// Why a connect failed, if for a security reason: what the bridge saw
/// (a refused handshake or login), else what rskafka's error says.
pub fn security_failure(
    settings: &KafkaSettings,
    bridge: Option<&TlsBridge>,
    error: Option<&rskafka::client::error::Error>,
) -> Option<SecurityError> {
    bridge.and_then(TlsBridge::take_failure).or_else(|| {
        explain_connect(
            settings.security_protocol(),
            settings.sasl.as_ref().map(|sasl| sasl.mechanism),
            &settings.bootstrap_servers.join(","),
            error?,
        )
    })
}

/// The name of a connect that timed out. A TLS listener answers plaintext
/// with a TLS alert, which rskafka reads as the length of a huge response
/// and waits for: under a plaintext protocol the name says so.
pub fn connect_operation(settings: &KafkaSettings) -> &'static str {
    match settings.security_protocol() {
        SecurityProtocol::Plaintext => {
            "connect (KAFKA_SECURITY_PROTOCOL=PLAINTEXT: a TLS listener?)"
        }
        SecurityProtocol::SaslPlaintext => {
            "connect (KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT: a TLS listener?)"
        }
        SecurityProtocol::Ssl | SecurityProtocol::SaslSsl => "connect",
    }
}

/// The security reason of a failed rskafka connection that did not go
/// through the bridge's handshake: refused SASL credentials, or a TLS
/// listener reached in plaintext. rskafka 0.6 does not export its
/// connection error type, so this reads the error's text.
pub(super) fn explain_connect(
    protocol: SecurityProtocol,
    mechanism: Option<SaslMechanism>,
    servers: &str,
    error: &rskafka::client::error::Error,
) -> Option<SecurityError> {
    let text = error.to_string();
    if let Some(mechanism) = mechanism
        && text.contains("Sasl handshake failed")
    {
        return Some(SecurityError::Sasl {
            mechanism: mechanism_name(mechanism),
            servers: servers.to_owned(),
        });
    }
    let lower = text.to_ascii_lowercase();
    let closed = ["eof", "reset by peer", "broken pipe"]
        .iter()
        .any(|sign| lower.contains(sign));
    (!protocol.tls() && closed).then(|| SecurityError::NotPlaintext {
        servers: servers.to_owned(),
        protocol,
    })
}

pub(super) fn mechanism_name(mechanism: SaslMechanism) -> &'static str {
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
