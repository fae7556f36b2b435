//! `DATABASE_*`: the URLs (what they mean is [`crate::libpq`]'s), the
//! pooler in front of the database, and the pool's limits.

use std::{fmt, time::Duration};

use super::{
    ConfigError,
    catalog::{DATABASE_DIRECT_URL, DATABASE_POOLER},
    defaults,
};
use crate::libpq::DatabaseUrl;

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
                DATABASE_DIRECT_URL.name(),
                format!(
                    "is required by migrate when {}=transaction: migrations need a session, \
                     which a transaction pooler does not keep (give a URL that bypasses it)",
                    DATABASE_POOLER.name()
                ),
            )
        })
    }

    /// The server ends a transaction idle for longer than this (set on
    /// every session): twice the statement timeout.
    pub fn idle_in_transaction_timeout(&self) -> Duration {
        self.statement_timeout * 2
    }
}
