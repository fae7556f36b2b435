//! libpq's client behaviour, without libpq: its URL grammar, its `PG*`
//! environment variables, its password file and its `sslmode`s, turned
//! into a connection plan (what tokio-postgres connects with, host by
//! host, and the TLS each attempt uses).
//!
//! The worker's settings (`config`) read the URLs and variables; this
//! module says what they mean, as libpq would, and where it differs it
//! refuses rather than guesses (docs/configuration.md, "PostgreSQL TLS").
//! Connecting with a plan is `db::connect`.

mod conninfo;
pub mod env;
pub mod pgpass;
pub mod ssl;
pub mod url;

pub use conninfo::{ConnectPlan, DatabaseUrl, PasswordSource, host_list};
pub use env::Env;

/// A URL, variable or combination libpq's rules refuse: the setting to
/// name (the URL's, or the `PG*` variable a value came from) and why,
/// never any part of a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {problem}")]
pub struct LibpqError {
    pub setting: String,
    pub problem: String,
}

impl LibpqError {
    pub fn new(setting: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            setting: setting.into(),
            problem: problem.into(),
        }
    }
}
