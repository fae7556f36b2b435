//! libpq's TLS parameters of a parsed `DATABASE_URL` ([`PgUrl`]:
//! `sslmode`, `sslrootcert`, `sslcert`, `sslkey`) as [`PgTls`];
//! tokio-postgres, which knows only `sslmode` disable/prefer/require and no
//! certificate files, never sees them.
//!
//! The mapping follows libpq (PostgreSQL's documentation, "SSL Support",
//! table "SSL Mode Descriptions"). Where this worker differs it is never
//! weaker: `verify-ca` without a root file is refused at start (libpq fails
//! at connect), a named file that cannot be read is an error in every mode
//! (libpq skips a missing `sslrootcert` under `prefer`/`require`), and
//! nothing is read from `~/.postgresql/`. docs/configuration.md, "PostgreSQL TLS", lists
//! every difference with its test.

use std::{fmt, path::PathBuf};

use super::url::PgUrl;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// Plaintext first; TLS only when the server refuses the plaintext
    /// connection.
    Allow,
    /// TLS when the server offers it, else plaintext (libpq's default).
    Prefer,
    /// TLS, no certificate check (unless `sslrootcert` is given: then as
    /// `verify-ca`, as libpq does).
    Require,
    /// TLS, the server's chain must lead to a root in `sslrootcert`.
    VerifyCa,
    /// As `verify-ca`, and the certificate must name the host connected to.
    VerifyFull,
}

impl SslMode {
    pub const ALL: [SslMode; 6] = [
        SslMode::Disable,
        SslMode::Allow,
        SslMode::Prefer,
        SslMode::Require,
        SslMode::VerifyCa,
        SslMode::VerifyFull,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether a connection in this mode fails rather than go without TLS.
    pub fn requires_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the trusted roots come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// Not given: no chain check under `prefer`/`require`; the bundled
    /// webpki roots (Mozilla's) under `verify-ca`/`verify-full`.
    Unset,
    /// `sslrootcert=system`: the bundled webpki roots (the image has no
    /// system store); as in libpq 16, it makes `verify-full` the default and
    /// refuses weaker modes.
    System,
    /// A PEM file with one or more CA certificates, read for every new
    /// connection.
    File(PathBuf),
}

/// A client certificate for mutual TLS (`sslcert` + `sslkey`, both PEM),
/// read for every new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What the certificate check of the server covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Nothing (the handshake signatures still are checked).
    Nothing,
    /// The chain up to a trusted root, and the validity dates.
    Chain,
    /// The chain and the host name.
    ChainAndName,
}

/// The TLS settings of `DATABASE_URL` (and of libpq's `PGSSL*`
/// variables where the URL does not give the parameter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTls {
    pub mode: SslMode,
    pub root: RootCerts,
    pub client: Option<ClientCert>,
    /// The parameters that came from a `PGSSL*` variable, with its name
    /// (errors about them name the variable).
    pub from_env: Vec<(&'static str, &'static str)>,
}

impl Default for PgTls {
    fn default() -> Self {
        Self {
            mode: SslMode::Prefer,
            root: RootCerts::Unset,
            client: None,
            from_env: Vec::new(),
        }
    }
}

impl PgTls {
    /// The check libpq makes in this mode: `require` (and `prefer`, `allow`)
    /// check the chain when `sslrootcert` is given.
    pub fn verify(&self) -> Verify {
        match (self.mode, &self.root) {
            (SslMode::VerifyFull, _) => Verify::ChainAndName,
            (SslMode::VerifyCa, _) => Verify::Chain,
            (_, RootCerts::Unset) => Verify::Nothing,
            (_, _) => Verify::Chain,
        }
    }

    /// Whether TLS may be used at all.
    pub fn may_use_tls(&self) -> bool {
        self.mode != SslMode::Disable
    }

    /// The setting a parameter's value came from: its `PGSSL*` variable,
    /// or `url_setting` (`DATABASE_URL`, `DATABASE_DIRECT_URL`).
    pub fn setting_of<'a>(&self, param: &str, url_setting: &'a str) -> &'a str {
        self.from_env
            .iter()
            .find(|(p, _)| *p == param)
            .map_or(url_setting, |(_, variable)| variable)
    }
}

/// libpq's TLS variables: each the default of its URL parameter.
#[derive(Debug, Clone, Copy, Default)]
pub struct TlsEnv<'a> {
    pub sslmode: Option<SslMode>,
    pub sslrootcert: Option<&'a str>,
    pub sslcert: Option<&'a str>,
    pub sslkey: Option<&'a str>,
}

/// The parameters this module reads; [`super::DatabaseUrl`] passes every
/// other one to tokio-postgres.
pub const TLS_PARAMETERS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// The TLS settings of a parsed URL's query parameters, each missing one
/// taken from `env` (libpq's `PGSSL*` variables), as libpq does. The error
/// is (the setting to name, the problem): the variable when the value came
/// from one, else `url_setting`. Its text never contains the URL.
pub fn from_params(
    url: &PgUrl,
    env: &TlsEnv<'_>,
    url_setting: &'static str,
) -> Result<PgTls, (&'static str, String)> {
    let mut from_env = Vec::new();
    let mut value = |param: &'static str, variable: &'static str, fallback: Option<&str>| match url
        .param(param)
    {
        Some(value) => Some(value.to_owned()),
        None => {
            let value = fallback.filter(|v| !v.is_empty())?;
            from_env.push((param, variable));
            Some(value.to_owned())
        }
    };
    // As in libpq and tokio-postgres, a later value wins.
    let mode = match url.param("sslmode") {
        Some(mode) => Some(parse_mode(mode).map_err(|e| (url_setting, e))?),
        None => env.sslmode,
    };
    let mode_setting = if url.param("sslmode").is_none() && mode.is_some() {
        "PGSSLMODE"
    } else {
        url_setting
    };
    let root_text = value("sslrootcert", "PGSSLROOTCERT", env.sslrootcert);
    let cert = value("sslcert", "PGSSLCERT", env.sslcert).filter(|v| !v.is_empty());
    let key = value("sslkey", "PGSSLKEY", env.sslkey).filter(|v| !v.is_empty());
    if mode_setting == "PGSSLMODE" {
        from_env.push(("sslmode", "PGSSLMODE"));
    }
    let tls_setting = |param: &str| {
        from_env
            .iter()
            .find(|(p, _)| *p == param)
            .map_or(url_setting, |(_, v)| *v)
    };
    let root = match root_text.as_deref() {
        None | Some("") => RootCerts::Unset,
        Some("system") => RootCerts::System,
        Some(path) => RootCerts::File(PathBuf::from(path)),
    };
    let mode = match (mode, &root) {
        (None, RootCerts::System) => SslMode::VerifyFull,
        (Some(mode), RootCerts::System) if mode != SslMode::VerifyFull => {
            return Err((
                mode_setting,
                format!(
                    "sslmode={mode} may not be used with sslrootcert=system (use verify-full, as libpq requires)"
                ),
            ));
        }
        // libpq refuses verify-ca without a root certificate file: public
        // roots without a host name check would accept any publicly
        // trusted certificate, issued for any name.
        (Some(SslMode::VerifyCa), RootCerts::Unset) => {
            return Err((
                mode_setting,
                "sslmode=verify-ca needs sslrootcert=FILE, the CA the server's \
                 certificate must chain to (libpq refuses verify-ca without one; \
                 for public CAs use verify-full)"
                    .to_owned(),
            ));
        }
        (mode, _) => mode.unwrap_or(SslMode::Prefer),
    };
    let client = match (cert, key) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some(ClientCert {
            cert: cert.into(),
            key: key.into(),
        }),
        (Some(_), None) => {
            return Err((
                tls_setting("sslcert"),
                "sslcert is given without sslkey (PGSSLKEY)".to_owned(),
            ));
        }
        (None, Some(_)) => {
            return Err((
                tls_setting("sslkey"),
                "sslkey is given without sslcert (PGSSLCERT)".to_owned(),
            ));
        }
    };
    Ok(PgTls {
        mode,
        root,
        client,
        from_env,
    })
}

/// `sslmode`'s value.
pub fn parse_mode(value: &str) -> Result<SslMode, String> {
    SslMode::ALL
        .into_iter()
        .find(|mode| mode.as_str() == value)
        .ok_or_else(|| {
            let all: Vec<&str> = SslMode::ALL.iter().map(|m| m.as_str()).collect();
            format!("sslmode {value:?} is not one of {}", all.join(", "))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls_of(raw: &str) -> Result<PgTls, String> {
        tls_with(raw, &TlsEnv::default()).map_err(|(_, problem)| problem)
    }

    fn tls_with(raw: &str, env: &TlsEnv<'_>) -> Result<PgTls, (&'static str, String)> {
        from_params(
            &PgUrl::parse(raw).expect("a valid URL"),
            env,
            "DATABASE_URL",
        )
    }

    fn split(raw: &str) -> PgTls {
        tls_of(raw).unwrap()
    }

    #[test]
    fn without_parameters_the_default_is_prefer() {
        let tls = split("postgres://u:p@h:5432/db");
        assert_eq!(tls, PgTls::default());
        assert_eq!(tls.mode, SslMode::Prefer);
        assert_eq!(tls.verify(), Verify::Nothing);
    }

    #[test]
    fn the_libpq_parameters_are_read_decoded() {
        let tls = split(
            "postgres://u:p@h/db?application_name=a%20b&sslmode=verify-full&sslrootcert=/etc/ca%2Bx.pem\
             &options=-c%20x%3D1&sslcert=/c.pem&sslkey=/k.pem&channel_binding=require",
        );
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root, RootCerts::File("/etc/ca+x.pem".into()));
        assert_eq!(
            tls.client,
            Some(ClientCert {
                cert: "/c.pem".into(),
                key: "/k.pem".into()
            })
        );
        assert_eq!(tls.verify(), Verify::ChainAndName);
    }

    #[test]
    fn each_mode_maps_to_libpqs_check() {
        let verify = |query: &str| split(&format!("postgres://h/db?{query}")).verify();
        assert_eq!(verify("sslmode=disable"), Verify::Nothing);
        assert_eq!(verify("sslmode=allow"), Verify::Nothing);
        assert_eq!(verify("sslmode=prefer"), Verify::Nothing);
        assert_eq!(verify("sslmode=require"), Verify::Nothing);
        // libpq: require with a root certificate file behaves as verify-ca.
        assert_eq!(verify("sslmode=require&sslrootcert=/ca.pem"), Verify::Chain);
        assert_eq!(verify("sslmode=prefer&sslrootcert=/ca.pem"), Verify::Chain);
        assert_eq!(
            verify("sslmode=verify-ca&sslrootcert=/ca.pem"),
            Verify::Chain
        );
        assert_eq!(verify("sslmode=verify-full"), Verify::ChainAndName);
        assert_eq!(verify("sslrootcert=system"), Verify::ChainAndName);
        assert!(!split("postgres://h/db?sslmode=disable").may_use_tls());
    }

    #[test]
    fn system_roots_need_verify_full_as_in_libpq() {
        let tls = split("postgres://h/db?sslrootcert=system");
        assert_eq!(
            (tls.mode, tls.root),
            (SslMode::VerifyFull, RootCerts::System)
        );
        for mode in ["require", "verify-ca", "prefer"] {
            let error = tls_of(&format!(
                "postgres://h/db?sslrootcert=system&sslmode={mode}"
            ))
            .unwrap_err();
            assert_eq!(
                error,
                format!(
                    "sslmode={mode} may not be used with sslrootcert=system (use verify-full, as libpq requires)"
                )
            );
        }
    }

    /// libpq refuses verify-ca without a root file; the bundled public
    /// roots without a host name check would accept a publicly trusted
    /// certificate issued for any name.
    #[test]
    fn verify_ca_needs_a_root_file() {
        for query in ["sslmode=verify-ca", "sslmode=verify-ca&sslrootcert="] {
            let error = tls_of(&format!("postgres://u:s3cret@h/db?{query}")).unwrap_err();
            assert!(
                error.starts_with("sslmode=verify-ca needs sslrootcert=FILE"),
                "{error}"
            );
        }
    }

    /// The defect of issue 25: a `?` in the password hid `sslmode` from
    /// the old split at the first `?`, leaving libpq's default `prefer`
    /// (plaintext when the server offers no TLS).
    #[test]
    fn sslmode_is_read_whatever_the_password_holds() {
        for password in [
            "a?b",
            "a?sslmode=disable",
            "x#y",
            "p/q?r",
            "a@b",
            "a b:c",
            "%3F%26",
        ] {
            let raw = format!("postgres://app:{password}@db.example/crm?sslmode=require");
            assert_eq!(split(&raw).mode, SslMode::Require, "{password}");
        }
    }

    #[test]
    fn bad_values_are_named_and_the_url_is_never_echoed() {
        let error = tls_of("postgres://u:s3cret@h/db?sslmode=verify").unwrap_err();
        assert_eq!(
            error,
            "sslmode \"verify\" is not one of disable, allow, prefer, require, verify-ca, verify-full"
        );
        let error = tls_of("postgres://u:s3cret@h/db?sslcert=/c.pem").unwrap_err();
        assert_eq!(error, "sslcert is given without sslkey (PGSSLKEY)");
        let error = tls_of("postgres://u:s3cret@h/db?sslkey=/k.pem").unwrap_err();
        assert!(!error.contains("s3cret"));
    }
}
