//! `DATABASE_*`: the URL parsed once the way libpq parses it, the pooler
//! in front of it, and the pool's limits.

use std::{fmt, time::Duration};

use super::{ConfigError, defaults, pg_tls, pg_url};

/// A PostgreSQL URL that never prints its password: parsed once, the way
/// libpq parses it ([`pg_url`]), into the configuration tokio-postgres
/// connects with and libpq's TLS parameters ([`pg_tls`]).
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    url: pg_url::PgUrl,
    /// What tokio-postgres connects with: the parts of `url`, libpq's TLS
    /// parameters left out (`db::tls` adds them).
    config: tokio_postgres::Config,
    tls: pg_tls::PgTls,
}

impl DatabaseUrl {
    /// Parses the URL and its TLS parameters. The certificate and key files
    /// they name are checked at start by `db::tls::check` (a bad file
    /// exits 2 as a bad setting does).
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        const SETTING: &str = "DATABASE_URL";
        let url =
            pg_url::PgUrl::parse(raw).map_err(|e| ConfigError::new(SETTING, e.to_string()))?;
        let tls =
            pg_tls::from_params(&url).map_err(|problem| ConfigError::new(SETTING, problem))?;
        let config = tokio_config(&url).map_err(|problem| ConfigError::new(SETTING, problem))?;
        Ok(Self { url, config, tls })
    }

    /// The configuration tokio-postgres connects with (password included,
    /// libpq's TLS parameters left out; its `Debug` hides the password).
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// Whether the URL asks for a writable server
    /// (`target_session_attrs=read-write`).
    pub fn wants_read_write(&self) -> bool {
        self.config.get_target_session_attrs()
            == tokio_postgres::config::TargetSessionAttrs::ReadWrite
    }

    /// The TLS settings of the URL.
    pub fn tls(&self) -> &pg_tls::PgTls {
        &self.tls
    }

    /// The URL with the password replaced, for logs, rebuilt from the
    /// parsed parts ([`pg_url::PgUrl::redacted`]).
    pub fn redacted(&self) -> String {
        self.url.redacted()
    }
}

/// The tokio-postgres configuration of a parsed URL: the parts and the
/// parameters but libpq's TLS ones, given to tokio-postgres as a key=value
/// string of quoted values (its parser applies each parameter as libpq
/// would), and the password set apart (it never goes into a string).
/// A `host` or `port` parameter replaces the authority's, as in libpq.
fn tokio_config(url: &pg_url::PgUrl) -> Result<tokio_postgres::Config, String> {
    fn quoted(value: &str) -> String {
        format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
    }
    let mut pairs: Vec<(&str, String)> = Vec::new();
    let has = |key: &str| url.params.iter().any(|(k, _)| k == key);
    if !url.hosts.is_empty() && !has("host") {
        let names: Vec<&str> = url.hosts.iter().map(|h| h.name.as_str()).collect();
        pairs.push(("host", names.join(",")));
    }
    if url.hosts.iter().any(|h| h.port.is_some()) && !has("port") {
        let ports: Vec<String> = url
            .hosts
            .iter()
            .map(|h| h.port.map_or_else(String::new, |p| p.to_string()))
            .collect();
        pairs.push(("port", ports.join(",")));
    }
    if let Some(user) = url.user() {
        pairs.push(("user", user.to_owned()));
    }
    if let Some(dbname) = url.dbname() {
        pairs.push(("dbname", dbname.to_owned()));
    }
    for (key, value) in &url.params {
        let pg_url::Value::Text(value) = value else {
            continue;
        };
        if pg_tls::TLS_PARAMETERS.contains(&key.as_str())
            || matches!(key.as_str(), "user" | "dbname")
        {
            continue;
        }
        pairs.push((key, value.clone()));
    }
    let text: Vec<String> = pairs
        .iter()
        .map(|(key, value)| format!("{key}={}", quoted(value)))
        .collect();
    // tokio-postgres's errors name the option, never its value.
    let mut config = text
        .join(" ")
        .parse::<tokio_postgres::Config>()
        .map_err(|e| {
            let cause =
                std::error::Error::source(&e).map_or_else(String::new, |c| format!(" ({c})"));
            format!("{e}{cause}")
        })?;
    if let Some(password) = url.password() {
        config.password(password.expose());
    }
    let no_host = |host: &tokio_postgres::config::Host| match host {
        tokio_postgres::config::Host::Tcp(name) => name.is_empty(),
        tokio_postgres::config::Host::Unix(_) => false,
    };
    if config.get_hosts().is_empty() || config.get_hosts().iter().any(no_host) {
        return Err("has no host".to_owned());
    }
    Ok(config)
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// What sits between the worker and PostgreSQL (`DATABASE_POOLER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooler {
    /// Nothing, or a pooler in session mode: a connection is one session.
    None,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`):
    /// a server session is the worker's only during a transaction. Named
    /// prepared statements, session `SET`s and LISTEN do not survive it.
    Transaction,
}

impl Pooler {
    /// Whether a connection is one server session for as long as it is
    /// open. The pooler rules all follow from this one answer, and every
    /// place that applies them asks it:
    ///
    /// - without sessions, no session `SET` is sent (the limits belong on
    ///   the role: `db::pool`);
    /// - named prepared statements must not outlive their transaction, so
    ///   diesel-async's statement cache is off and its set-up runs inside a
    ///   transaction (`db::connect`);
    /// - LISTEN (the commit wake-up) and `migrate`'s advisory lock need a
    ///   session: `DATABASE_DIRECT_URL`, or none ([`DatabaseSettings::session`]);
    /// - `run` says so at start (`app`).
    pub fn keeps_sessions(self) -> bool {
        match self {
            Pooler::None => true,
            Pooler::Transaction => false,
        }
    }
}

impl fmt::Display for Pooler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Pooler::None => "none",
            Pooler::Transaction => "transaction",
        })
    }
}

/// The pool and the session limits of every connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseSettings {
    pub url: DatabaseUrl,
    pub pool_size: u32,
    pub connect_timeout: Duration,
    pub statement_timeout: Duration,
    /// The pooler in front of `url`, if any.
    pub pooler: Pooler,
    /// A direct (session) connection past the pooler
    /// (`DATABASE_DIRECT_URL`): the commit wake-up's LISTEN and `migrate`.
    pub direct_url: Option<DatabaseUrl>,
    /// `url` is `DATABASE_DIRECT_URL` (errors name that setting).
    pub is_direct: bool,
}

impl DatabaseSettings {
    /// Settings for `url` alone: no pooler, no direct URL, the default limits.
    pub fn new(url: DatabaseUrl) -> Self {
        Self {
            url,
            pool_size: defaults::DATABASE_POOL_SIZE,
            connect_timeout: defaults::DATABASE_CONNECT_TIMEOUT,
            statement_timeout: defaults::DATABASE_STATEMENT_TIMEOUT,
            pooler: defaults::DATABASE_POOLER,
            direct_url: None,
            is_direct: false,
        }
    }

    /// The same limits on the direct connection: `DATABASE_DIRECT_URL` when
    /// given, else `DATABASE_URL` unless that is a transaction pooler,
    /// which cannot keep a session (then `None`).
    pub fn session(&self) -> Option<DatabaseSettings> {
        let (url, is_direct) = match (&self.direct_url, self.pooler) {
            (Some(direct), _) => (direct.clone(), true),
            (None, pooler) if pooler.keeps_sessions() => (self.url.clone(), self.is_direct),
            (None, _) => return None,
        };
        Some(DatabaseSettings {
            url,
            pooler: Pooler::None,
            direct_url: None,
            is_direct,
            ..self.clone()
        })
    }

    /// The settings `migrate` connects with: a session is needed (an
    /// advisory lock serialises concurrent runs), so through a transaction
    /// pooler `DATABASE_DIRECT_URL` is required.
    pub fn for_migrate(&self) -> Result<DatabaseSettings, ConfigError> {
        self.session().ok_or_else(|| {
            ConfigError::new(
                "DATABASE_DIRECT_URL",
                "is required by migrate when DATABASE_POOLER=transaction: migrations need a \
                 session, which a transaction pooler does not keep (give a URL that bypasses it)",
            )
        })
    }

    /// The server ends a transaction idle for longer than this (set on
    /// every session): twice the statement timeout.
    pub fn idle_in_transaction_timeout(&self) -> Duration {
        self.statement_timeout * 2
    }
}
