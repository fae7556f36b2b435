//! libpq's environment variables (`PGHOST`, `PGPORT`, `PGDATABASE`,
//! `PGUSER`, `PGPASSWORD`, `PGPASSFILE`, `PGSSLMODE`, `PGSSLROOTCERT`,
//! `PGSSLCERT`, `PGSSLKEY`, `PGAPPNAME`, `PGCONNECT_TIMEOUT`) and how libpq
//! reads their values: each one is used only where the URL does not give
//! the same parameter (the URL wins, then the variable, then, for the
//! password, the password file). [`super::DatabaseUrl::with_env`] applies
//! them to a URL. The worker reads them as it reads every setting (a flag
//! or the variable of the same name: `config`), with the value checks
//! below.
//!
//! An empty variable counts as unset.

use std::path::PathBuf;

use super::{
    ssl::{self, SslMode},
    url::Password,
};

/// The libpq variables, each the default of one URL parameter; `None`
/// (or empty) is unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    /// Host(s): names, addresses or Unix socket directories, comma-separated.
    pub host: Option<String>,
    /// Port(s), comma-separated ([`ports`]).
    pub port: Option<String>,
    pub dbname: Option<String>,
    pub user: Option<String>,
    pub password: Option<Password>,
    /// The password file; unset: `~/.pgpass` ([`Env::passfile`]).
    pub passfile: Option<PathBuf>,
    pub sslmode: Option<SslMode>,
    pub sslrootcert: Option<String>,
    pub sslcert: Option<String>,
    pub sslkey: Option<String>,
    pub appname: Option<String>,
    /// Whole seconds per host ([`seconds`]).
    pub connect_timeout: Option<String>,
}

impl Env {
    /// The password file to read: `PGPASSFILE`, else `~/.pgpass` (`HOME`,
    /// else the user's home directory from the system, as libpq finds it);
    /// `None` when no home directory is known.
    pub fn passfile(&self) -> Option<PathBuf> {
        self.passfile
            .clone()
            .filter(|path| !path.as_os_str().is_empty())
            .or_else(|| std::env::home_dir().map(|home| home.join(".pgpass")))
    }
}

/// An `sslmode`, or none for an empty value.
pub fn sslmode(raw: &str) -> Result<Option<SslMode>, String> {
    match raw.trim() {
        "" => Ok(None),
        mode => ssl::parse_mode(mode).map(Some),
    }
}

/// A comma-separated list of ports (1-65535); an empty entry is the
/// default port, as in libpq.
pub fn ports(raw: &str) -> Result<String, String> {
    for port in raw.split(',') {
        let port = port.trim();
        if !port.is_empty() && !port.parse::<u16>().is_ok_and(|p| p != 0) {
            return Err(format!(
                "{port:?} is not a port from 1 to 65535 (a comma-separated list is one per host)"
            ));
        }
    }
    Ok(raw.split(',').map(str::trim).collect::<Vec<_>>().join(","))
}

/// Whole seconds, as libpq's `connect_timeout` (0 or less: no limit);
/// empty is unset.
pub fn seconds(raw: &str) -> Result<String, String> {
    if raw.trim().is_empty() {
        return Ok(String::new());
    }
    raw.trim()
        .parse::<i64>()
        .map(|s| s.to_string())
        .map_err(|_| format!("{raw:?} is not a whole number of seconds"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_as_libpq_takes_them() {
        assert_eq!(ports("5432"), Ok("5432".to_owned()));
        assert_eq!(ports("5432, 5433,"), Ok("5432,5433,".to_owned()));
        for bad in ["0", "65536", "x", "54 32", "5432;5433"] {
            assert!(ports(bad).is_err(), "{bad}");
        }
        assert_eq!(seconds(" 10 "), Ok("10".to_owned()));
        assert_eq!(seconds("0"), Ok("0".to_owned()));
        assert!(seconds("10s").is_err());
        assert_eq!(seconds(""), Ok(String::new()), "unset");
        assert_eq!(sslmode("verify-full"), Ok(Some(SslMode::VerifyFull)));
        assert_eq!(sslmode(" "), Ok(None), "unset");
        assert!(sslmode("verify").is_err());
    }

    #[test]
    fn the_password_file_is_pgpassfile_else_the_home_directorys() {
        let env = Env {
            passfile: Some("/run/secrets/pgpass".into()),
            ..Env::default()
        };
        assert_eq!(env.passfile(), Some(PathBuf::from("/run/secrets/pgpass")));
        let empty = Env {
            passfile: Some(PathBuf::new()),
            ..Env::default()
        };
        assert_eq!(empty.passfile(), Env::default().passfile(), "unset");
        let default = Env::default().passfile();
        assert_eq!(
            default,
            std::env::home_dir().map(|home| home.join(".pgpass"))
        );
    }
}
