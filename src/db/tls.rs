//! TLS to PostgreSQL without C: the rustls client configuration for the
//! libpq modes of `DATABASE_URL` ([`PgTls`]) on the pure-Rust graviola
//! provider, the certificate checks each mode makes, and their check at
//! start. Connecting with them is [`super::connect`].
//!
//! The configuration is built again for every new connection, reading the
//! certificate and key files each time, so a rotated certificate (say,
//! cert-manager rewriting a mounted secret) is used without a restart.

use std::{path::Path, sync::Arc};

use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
        verify_server_cert_signed_by_trust_anchor,
    },
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    server::ParsedCertificate,
};

use crate::{
    config::ConfigError,
    libpq::{
        DatabaseUrl,
        ssl::{PgTls, RootCerts, Verify},
    },
};

pub use crate::tls::{TlsFileError, cpu_supported};
use crate::tls::{key_problem, load_certs, provider};

/// `sslkey`, after libpq's check of who else may read it.
fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    if let Ok(metadata) = std::fs::metadata(path) {
        key_file_mode(path, &metadata)?;
    }
    crate::tls::load_key("sslkey", path)
}

/// libpq's rule for the private key file (`fe-secure-openssl.c`): a regular
/// file, with no access for group or others (0600 or less), except that a
/// file root owns may be read by its group (0640 or less: a secret volume's
/// files, root's, shared with the pod's group).
fn key_file_mode(path: &Path, metadata: &std::fs::Metadata) -> Result<(), TlsFileError> {
    use std::os::unix::fs::MetadataExt as _;
    if !metadata.is_file() {
        return Err(TlsFileError::new("sslkey", path, "is not a regular file"));
    }
    let mode = metadata.mode();
    let too_open = if metadata.uid() == 0 {
        mode & 0o037 != 0
    } else {
        mode & 0o077 != 0
    };
    if too_open {
        return Err(TlsFileError::new(
            "sslkey",
            path,
            format!(
                "has group or world access (mode {:04o}): it must be 0600 or less, or 0640 \
                 or less when root owns it (libpq's rule)",
                mode & 0o7777
            ),
        ));
    }
    Ok(())
}

/// The check at start of a database URL's TLS, before anything connects:
/// the CPU can run the TLS library when the `sslmode` requires TLS, and
/// [`validate`]. Its error names `setting` (`DATABASE_URL` or
/// `DATABASE_DIRECT_URL`), an exit 2.
pub fn check(setting: &'static str, url: &DatabaseUrl) -> Result<(), ConfigError> {
    let tls = url.tls();
    if tls.mode.requires_tls()
        && let Some(problem) = crate::tls::unsupported_cpu(format_args!("sslmode={}", tls.mode))
    {
        return Err(ConfigError::new(setting, problem));
    }
    // A file named by a PGSSL* variable is named by that variable.
    validate(tls).map_err(|e| ConfigError::new(tls.setting_of(e.setting, setting), e.to_string()))
}

/// Checks at start what [`client_config`] will read for every connection:
/// an unreadable or malformed file is a configuration error then, not a
/// connection failure later. Without a supported CPU only the PEM files are
/// parsed (loading the key would run graviola).
pub fn validate(tls: &PgTls) -> Result<(), TlsFileError> {
    if !tls.may_use_tls() {
        return Ok(());
    }
    if cpu_supported() {
        return client_config(tls).map(drop);
    }
    if let RootCerts::File(path) = &tls.root {
        load_certs("sslrootcert", path)?;
    }
    if let Some(client) = &tls.client {
        load_certs("sslcert", &client.cert)?;
        load_key(&client.key)?;
    }
    Ok(())
}

/// The rustls configuration for one new connection, the files read now.
pub fn client_config(tls: &PgTls) -> Result<ClientConfig, TlsFileError> {
    client_config_trusting(tls, crate::tls::bundled_roots)
}

/// [`client_config`] with `public_roots` in place of the bundled webpki
/// roots (what `verify-full` without `sslrootcert`, and
/// `sslrootcert=system`, trust). Production passes
/// [`crate::tls::bundled_roots`]; `tests/it/pg_tls.rs` adds a private CA
/// to them, standing for a public CA that signed a certificate for another
/// host. Nothing outside the process can reach this parameter.
pub fn client_config_trusting(
    tls: &PgTls,
    public_roots: impl FnOnce() -> RootCertStore,
) -> Result<ClientConfig, TlsFileError> {
    let provider = provider();
    let verifier: Arc<dyn ServerCertVerifier> = match tls.verify() {
        Verify::Nothing => Arc::new(NoCertificateCheck {
            provider: Arc::clone(&provider),
        }),
        Verify::Chain => Arc::new(ChainOnly {
            roots: root_store(tls, public_roots)?,
            provider: Arc::clone(&provider),
        }),
        Verify::ChainAndName => WebPkiServerVerifier::builder_with_provider(
            root_store(tls, public_roots)?,
            Arc::clone(&provider),
        )
        .build()
        .map_err(|e| root_error(tls, format!("no usable root certificate ({e})")))?,
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| root_error(tls, format!("the TLS provider refuses TLS 1.2/1.3 ({e})")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match &tls.client {
        None => Ok(builder.with_no_client_auth()),
        Some(client) => {
            let certs = load_certs("sslcert", &client.cert)?;
            // The certificate's fault, named as such: rustls would refuse
            // a v1 leaf as a key that does not fit it (naming sslkey).
            if certs
                .first()
                .is_some_and(|leaf| crate::tls::is_x509_v1(leaf))
            {
                return Err(TlsFileError::new(
                    "sslcert",
                    &client.cert,
                    crate::tls::X509_V1,
                ));
            }
            let key = load_key(&client.key)?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| match e {
                    rustls::Error::InvalidCertificate(_) => TlsFileError::new(
                        "sslcert",
                        &client.cert,
                        format!("cannot be used ({})", key_problem(&e)),
                    ),
                    _ => TlsFileError::new(
                        "sslkey",
                        &client.key,
                        format!("cannot be used with sslcert ({})", key_problem(&e)),
                    ),
                })
        }
    }
}

fn root_error(tls: &PgTls, problem: String) -> TlsFileError {
    match &tls.root {
        RootCerts::File(path) => TlsFileError::new("sslrootcert", path, problem),
        _ => TlsFileError::new("sslrootcert", Path::new("(webpki roots)"), problem),
    }
}

/// The trusted roots: the `sslrootcert` file, else the public roots (the
/// bundled webpki roots, Mozilla's CA list; a `FROM scratch` image has no
/// system store). Only `verify-full` and `sslrootcert=system` come here
/// without a file (`verify-ca` without one is refused at start): with
/// public roots the host name is always checked.
fn root_store(
    tls: &PgTls,
    public_roots: impl FnOnce() -> RootCertStore,
) -> Result<Arc<RootCertStore>, TlsFileError> {
    Ok(Arc::new(match &tls.root {
        RootCerts::File(path) => crate::tls::root_store_from("sslrootcert", path)?,
        RootCerts::Unset | RootCerts::System => public_roots(),
    }))
}

/// `sslmode=require` (and `prefer`, `allow`) without `sslrootcert`: libpq
/// checks no certificate. The handshake signature is still verified, so
/// the connection is bound to the certificate the server showed, which is
/// what SCRAM channel binding (`tls-server-end-point`) builds on.
#[derive(Debug)]
struct NoCertificateCheck {
    provider: Arc<CryptoProvider>,
}

/// `sslmode=verify-ca` (or `require` with `sslrootcert`): the chain must
/// lead to a trusted root and be within its validity dates; the host name
/// is not checked.
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

macro_rules! handshake_signatures {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
}

impl ServerCertVerifier for NoCertificateCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!();
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!();
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_key_file_others_may_read_is_refused_as_libpq_does() {
        let dir = std::env::temp_dir().join(format!("key-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("tls.key");
        std::fs::write(&key, "not read").unwrap();
        let mode_of = |mode: u32| {
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
            key_file_mode(&key, &std::fs::metadata(&key).unwrap())
        };
        let root = std::fs::metadata(&key).map(|m| {
            use std::os::unix::fs::MetadataExt as _;
            m.uid() == 0
        });
        assert_eq!(mode_of(0o600), Ok(()));
        assert_eq!(mode_of(0o400), Ok(()));
        let error = mode_of(0o644).unwrap_err();
        assert!(
            error
                .problem
                .starts_with("has group or world access (mode 0644)"),
            "{error}"
        );
        assert!(mode_of(0o604).is_err());
        // 0640: only when root owns the file.
        assert_eq!(mode_of(0o640).is_ok(), root.unwrap());
        let error = key_file_mode(&dir, &std::fs::metadata(&dir).unwrap()).unwrap_err();
        assert_eq!(error.problem, "is not a regular file");
        std::fs::remove_dir_all(&dir).ok();
    }
}
