//! What TLS to PostgreSQL ([`crate::db::tls`]) and to Kafka
//! ([`crate::outbox::kafka::security`]) share: the pure-Rust graviola crypto
//! provider under rustls (no C), its CPU check, the bundled root
//! certificates, and reading PEM certificate and key files so that an
//! error names the setting and the path, never the file's content.
//!
//! Files are read again for every new connection by both callers, so a
//! rotated certificate (cert-manager rewriting a mounted secret, say) is
//! used without a restart.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

use rustls::{
    RootCertStore,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
};

/// A certificate or key file that cannot be used. Its text names the
/// setting and the path, never the file's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} {}: {problem}", path.display())]
pub struct TlsFileError {
    pub setting: &'static str,
    pub path: PathBuf,
    pub problem: String,
}

impl TlsFileError {
    pub fn new(setting: &'static str, path: &Path, problem: impl Into<String>) -> Self {
        Self {
            setting,
            path: path.to_owned(),
            problem: problem.into(),
        }
    }
}

/// Whether graviola (the crypto under rustls here) runs on this CPU:
/// x86_64 with AVX2, ADX and BMI2 (about 2013 on), or aarch64. On another
/// CPU it would panic at the first handshake.
pub fn cpu_supported() -> bool {
    graviola::util::is_cpu_supported()
}

/// The start-up error of a setting that needs TLS on a CPU that cannot run
/// it, `needs` naming what asked for TLS (`sslmode=require`, `SSL`); `None`
/// on a supported CPU.
pub fn unsupported_cpu(needs: impl std::fmt::Display) -> Option<String> {
    (!cpu_supported()).then(|| {
        format!(
            "{needs} needs TLS, and this CPU cannot run the TLS library \
             (graviola needs x86_64 with AVX2, ADX and BMI2, or aarch64)"
        )
    })
}

/// The one crypto provider of every TLS connection of this process.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls_graviola::default_provider())))
}

/// The bundled webpki roots (Mozilla's CA list, compiled in): a `FROM
/// scratch` image has no system store to read.
pub fn bundled_roots() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

/// Every certificate of a PEM bundle as a trusted root.
pub fn root_store_from(setting: &'static str, path: &Path) -> Result<RootCertStore, TlsFileError> {
    let mut store = RootCertStore::empty();
    for (index, cert) in load_certs(setting, path)?.into_iter().enumerate() {
        store.add(cert).map_err(|e| {
            TlsFileError::new(
                setting,
                path,
                format!(
                    "certificate {} is not a usable CA certificate ({e})",
                    index + 1
                ),
            )
        })?;
    }
    Ok(store)
}

fn read(setting: &'static str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|e| TlsFileError::new(setting, path, format!("cannot read ({e})")))
}

/// A PEM error as text that never quotes the file (rustls-pki-types quotes
/// a malformed line, which may be a line of a key).
fn pem_problem(error: &rustls::pki_types::pem::Error, nothing: &str) -> String {
    use rustls::pki_types::pem::Error as E;
    match error {
        E::NoItemsFound => nothing.to_owned(),
        E::MissingSectionEnd { .. } => "malformed PEM (a section has no END line)".to_owned(),
        E::IllegalSectionStart { .. } => "malformed PEM (a malformed BEGIN line)".to_owned(),
        E::Base64Decode(_) => "malformed PEM (not base64 inside a section)".to_owned(),
        E::Io(e) => format!("cannot read ({e})"),
        _ => "malformed PEM".to_owned(),
    }
}

const NO_CERTIFICATE: &str = "no certificate in the file";

/// The certificates of a PEM file, in order (a chain: leaf first).
pub fn load_certs(
    setting: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let pem = read(setting, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsFileError::new(setting, path, pem_problem(&e, NO_CERTIFICATE)))?;
    if certs.is_empty() {
        return Err(TlsFileError::new(setting, path, NO_CERTIFICATE));
    }
    Ok(certs)
}

/// What is wrong with an X.509 v1 certificate here, for its setting's
/// line: rustls (webpki) takes v3 only, and otherwise refuses a v1 leaf as
/// a key that does not fit it.
pub const X509_V1: &str = "is an X.509 v1 certificate, and only v3 is accepted: reissue it \
                           as v3 (openssl x509 -req with -extfile, or openssl req -x509)";

/// Whether a DER certificate is X.509 v1: its `tbsCertificate` opens
/// without the explicit `[0] version` field that v2 and v3 carry
/// (`Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version
/// OPTIONAL, ... } ... }`).
pub fn is_x509_v1(der: &[u8]) -> bool {
    /// The content of the DER SEQUENCE at the start of `der` (to its end;
    /// only its first byte is looked at).
    fn content_of_sequence(der: &[u8]) -> Option<&[u8]> {
        let (&tag, rest) = der.split_first()?;
        let (&length, rest) = rest.split_first()?;
        let length_bytes = if length < 0x80 {
            0
        } else {
            usize::from(length & 0x7f)
        };
        (tag == 0x30).then_some(())?;
        rest.get(length_bytes..)
    }
    content_of_sequence(der)
        .and_then(content_of_sequence)
        .and_then(|tbs| tbs.first())
        .is_some_and(|&first| first != 0xA0)
}

/// The first unencrypted private key of a PEM file.
pub fn load_key(
    setting: &'static str,
    path: &Path,
) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    let pem = read(setting, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        TlsFileError::new(
            setting,
            path,
            pem_problem(
                &e,
                "no unencrypted private key (PKCS#8, RSA or EC) in the file",
            ),
        )
    })
}

/// A rustls error about a key, without anything of the key.
pub fn key_problem(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InconsistentKeys(_) => "the key does not belong to the certificate".into(),
        rustls::Error::General(text) => text.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The version field of a certificate: absent in v1, `[0] 2` in v3.
    #[test]
    fn x509_v1_is_told_from_v3() {
        // SEQUENCE { SEQUENCE { INTEGER serial ... } }: no [0], so v1.
        let v1 = [0x30, 0x06, 0x30, 0x04, 0x02, 0x02, 0x10, 0x00];
        // SEQUENCE { SEQUENCE { [0] { INTEGER 2 } ... } }, long-form lengths.
        let v3 = [
            0x30, 0x81, 0x09, 0x30, 0x81, 0x06, 0xA0, 0x03, 0x02, 0x01, 0x02, 0x02, 0x01,
        ];
        assert!(is_x509_v1(&v1));
        assert!(!is_x509_v1(&v3));
        assert!(!is_x509_v1(&[]), "no certificate is no v1 certificate");
        assert!(!is_x509_v1(&[0x04, 0x00]));
    }

    fn temp_file(name: &str, content: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("tls-{}-{name}", std::process::id()));
        std::fs::write(&path, content).expect("write a temporary file");
        path
    }

    #[test]
    fn bad_files_name_the_setting_and_never_quote_the_content() {
        let secret = "c2VjcmV0LWtleS1tYXRlcmlhbA";
        let malformed = temp_file(
            "malformed.pem",
            &format!("-----BEGIN PRIVATE KEY-----\n{secret}!!\n-----END PRIVATE KEY-----\n"),
        );
        let error = load_key("KAFKA_SSL_KEY_LOCATION", &malformed).unwrap_err();
        let text = error.to_string();
        assert!(text.starts_with("KAFKA_SSL_KEY_LOCATION "), "{text}");
        assert!(!text.contains(secret), "{text}");
        let error = load_certs("KAFKA_SSL_CA_LOCATION", &malformed).unwrap_err();
        assert!(!error.to_string().contains(secret), "{error}");
        let missing = Path::new("/nonexistent/ca.pem");
        let error = load_certs("KAFKA_SSL_CA_LOCATION", missing).unwrap_err();
        assert!(error.to_string().contains("cannot read"), "{error}");
        std::fs::remove_file(malformed).ok();
    }
}
