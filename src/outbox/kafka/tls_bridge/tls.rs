//! The rustls side of the bridge: the client configuration, read again
//! for every connection, its check at start, and the handshake.

use std::{path::Path, sync::Arc};

use rustls::{ClientConfig, client::WebPkiServerVerifier, pki_types::ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::diagnostics::{SecurityError, explain, no_tls_answer, rustls_error};
use super::socks5::{REPLY_FAILURE, REPLY_HOST_UNREACHABLE};
use crate::{
    config::{ConfigError, KafkaSettings, KafkaTls},
    tls::{TlsFileError, key_problem, load_certs, load_key, provider},
};

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

pub(super) type Failed = (u8, SecurityError);

/// TCP to the broker, with `TCP_NODELAY` (each relayed write goes out at
/// once).
pub(super) async fn connect_tcp(host: &str, port: u16, broker: &str) -> Result<TcpStream, Failed> {
    let tcp = TcpStream::connect((host, port)).await.map_err(|e| {
        (
            REPLY_HOST_UNREACHABLE,
            SecurityError::Connect {
                broker: broker.to_owned(),
                problem: e.to_string(),
            },
        )
    })?;
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// The TLS handshake over `tcp`, verifying the broker as `host`.
pub(super) async fn connect_tls(
    tcp: TcpStream,
    host: &str,
    broker: &str,
    tls: &KafkaTls,
) -> Result<Box<tokio_rustls::client::TlsStream<TcpStream>>, Failed> {
    // The files are read again for this connection (rotation).
    let config = client_config(tls).map_err(|e| (REPLY_FAILURE, e.into()))?;
    let name = ServerName::try_from(host.to_owned()).map_err(|_| {
        (
            REPLY_FAILURE,
            SecurityError::Handshake {
                broker: broker.to_owned(),
                problem: "not a valid host name to verify".to_owned(),
                hint: "check KAFKA_BOOTSTRAP_SERVERS and the broker's advertised listeners"
                    .to_owned(),
            },
        )
    })?;
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map(Box::new)
        .map_err(|error| {
            let failure = match rustls_error(&error) {
                Some(tls_error) => explain(tls_error, broker, tls),
                None => no_tls_answer(broker, &error.to_string()),
            };
            (REPLY_FAILURE, failure)
        })
}
