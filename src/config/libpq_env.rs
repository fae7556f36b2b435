//! libpq's environment variables (`PGHOST`, `PGPORT`, `PGDATABASE`,
//! `PGUSER`, `PGPASSWORD`, `PGPASSFILE`, `PGSSLMODE`, `PGSSLROOTCERT`,
//! `PGSSLCERT`, `PGSSLKEY`, `PGAPPNAME`, `PGCONNECT_TIMEOUT`), read as
//! every other setting is (a flag or the variable of the same name), and
//! used as libpq uses them: each one only where the URL does not give the
//! same parameter (the URL wins, then the variable, then, for the
//! password, the password file). [`super::DatabaseUrl::with_env`] applies
//! them to `DATABASE_URL` and `DATABASE_DIRECT_URL` alike.
//!
//! An empty variable counts as unset.

use std::path::PathBuf;

use clap::Args;

use super::{
    parse::{Problem, setting},
    pg_tls::{self, SslMode},
    secret::Secret,
};

/// The libpq variables, each the default of one URL parameter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct LibpqEnv {
    /// Default host(s) when the URL has none: names, addresses or Unix
    /// socket directories, comma-separated (libpq's PGHOST).
    #[arg(id = "PGHOST", long = "pghost", env = "PGHOST", value_parser = setting(non_empty))]
    pub host: Option<String>,
    /// Default port(s) when the URL has none, comma-separated (libpq's PGPORT).
    #[arg(id = "PGPORT", long = "pgport", env = "PGPORT", value_parser = setting(ports))]
    pub port: Option<String>,
    /// Default database when the URL names none (libpq's PGDATABASE).
    #[arg(id = "PGDATABASE", long = "pgdatabase", env = "PGDATABASE", value_parser = setting(non_empty))]
    pub dbname: Option<String>,
    /// Default user when the URL names none (libpq's PGUSER).
    #[arg(id = "PGUSER", long = "pguser", env = "PGUSER", value_parser = setting(non_empty))]
    pub user: Option<String>,
    /// Password when the URL has none (libpq's PGPASSWORD; prefer a
    /// password file, the environment of a process is easier to read).
    #[arg(id = "PGPASSWORD", long = "pgpassword", env = "PGPASSWORD", hide_env_values = true,
          allow_hyphen_values = true, value_parser = setting(secret))]
    pub password: Option<Secret>,
    /// Password file read when neither the URL nor PGPASSWORD gives a
    /// password; default ~/.pgpass (libpq's PGPASSFILE).
    #[arg(id = "PGPASSFILE", long = "pgpassfile", env = "PGPASSFILE", value_parser = setting(path))]
    pub passfile: Option<PathBuf>,
    /// Default sslmode (libpq's PGSSLMODE).
    // An empty value is unset too, hence one value that may say "none"
    // (`std::option::Option`) with an empty, hidden default.
    #[arg(id = "PGSSLMODE", long = "pgsslmode", env = "PGSSLMODE", default_value = "",
          hide_default_value = true, value_parser = setting(sslmode))]
    pub sslmode: std::option::Option<SslMode>,
    /// Default sslrootcert (libpq's PGSSLROOTCERT).
    #[arg(id = "PGSSLROOTCERT", long = "pgsslrootcert", env = "PGSSLROOTCERT", value_parser = setting(non_empty))]
    pub sslrootcert: Option<String>,
    /// Default sslcert (libpq's PGSSLCERT).
    #[arg(id = "PGSSLCERT", long = "pgsslcert", env = "PGSSLCERT", value_parser = setting(non_empty))]
    pub sslcert: Option<String>,
    /// Default sslkey (libpq's PGSSLKEY).
    #[arg(id = "PGSSLKEY", long = "pgsslkey", env = "PGSSLKEY", value_parser = setting(non_empty))]
    pub sslkey: Option<String>,
    /// Default application_name (libpq's PGAPPNAME).
    #[arg(id = "PGAPPNAME", long = "pgappname", env = "PGAPPNAME", value_parser = setting(non_empty))]
    pub appname: Option<String>,
    /// Default connect_timeout, whole seconds per host (libpq's
    /// PGCONNECT_TIMEOUT); DATABASE_CONNECT_TIMEOUT still bounds the whole
    /// connection.
    #[arg(id = "PGCONNECT_TIMEOUT", long = "pgconnect-timeout", env = "PGCONNECT_TIMEOUT",
          value_parser = setting(seconds))]
    pub connect_timeout: Option<String>,
}

impl LibpqEnv {
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

/// Any text but an empty one (an empty variable is unset).
fn non_empty(raw: &str) -> Result<String, Problem> {
    Ok(raw.to_owned())
}

fn secret(raw: &str) -> Result<Secret, Problem> {
    Ok(Secret::new(raw))
}

fn path(raw: &str) -> Result<PathBuf, Problem> {
    Ok(PathBuf::from(raw))
}

/// An `sslmode`, or none for an empty value.
fn sslmode(raw: &str) -> Result<Option<SslMode>, Problem> {
    match raw.trim() {
        "" => Ok(None),
        mode => pg_tls::parse_mode(mode).map(Some),
    }
}

/// A comma-separated list of ports (1-65535); an empty entry is the
/// default port, as in libpq.
fn ports(raw: &str) -> Result<String, Problem> {
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
fn seconds(raw: &str) -> Result<String, Problem> {
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
        let env = LibpqEnv {
            passfile: Some("/run/secrets/pgpass".into()),
            ..LibpqEnv::default()
        };
        assert_eq!(env.passfile(), Some(PathBuf::from("/run/secrets/pgpass")));
        let empty = LibpqEnv {
            passfile: Some(PathBuf::new()),
            ..LibpqEnv::default()
        };
        assert_eq!(empty.passfile(), LibpqEnv::default().passfile(), "unset");
        let default = LibpqEnv::default().passfile();
        assert_eq!(
            default,
            std::env::home_dir().map(|home| home.join(".pgpass"))
        );
    }
}
