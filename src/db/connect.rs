//! Opening one connection as `DATABASE_URL` says, with libpq's semantics:
//! several hosts tried in turn, `target_session_attrs`, the fallbacks of
//! `sslmode=allow` and `prefer`, errors that say which certificate check
//! failed, and the hand-off to diesel-async (through a transaction pooler,
//! its set-up inside a transaction).

use std::{error::Error as _, sync::Once};

use diesel::ConnectionError;
use diesel::connection::CacheSize;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use tokio_postgres::config::SslMode as WireSslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::tls::{TlsFileError, client_config, cpu_supported};
use crate::{
    config::Pooler,
    libpq::{
        DatabaseUrl,
        ssl::{PgTls, RootCerts, SslMode},
    },
};

/// Why one connection attempt failed.
enum Failure {
    /// A certificate or key file (read again for this connection).
    File(TlsFileError),
    /// Connecting, the TLS handshake, or the server's refusal.
    Postgres(tokio_postgres::Error),
    /// diesel-async's set-up of the connected client.
    Setup(ConnectionError),
    /// No connection within `connect_timeout` (libpq's, per host).
    Timeout {
        hosts: String,
        limit: std::time::Duration,
    },
}

impl Failure {
    /// libpq retries in the other mode after a failed TLS handshake or an
    /// error from the server; not after a refused TCP connection. Nor here
    /// after the server refused the password: it is the same password in
    /// the other mode, so the retry only doubles the refused logins in the
    /// server's log (and the lockouts counted from it), and under `prefer`
    /// would send it again without TLS. libpq 15 does retry (two refused
    /// logins per connection): a difference that is never weaker.
    fn retry_other_mode(&self) -> bool {
        match self {
            Failure::Postgres(error) => match error.as_db_error() {
                Some(db) => db.code() != &tokio_postgres::error::SqlState::INVALID_PASSWORD,
                None => rustls_error(error).is_some(),
            },
            Failure::File(_) | Failure::Setup(_) | Failure::Timeout { .. } => false,
        }
    }

    fn describe(&self, tls: &PgTls) -> String {
        match self {
            Failure::Timeout { hosts, limit } => format!(
                "no answer from {hosts} within connect_timeout ({} s)",
                limit.as_secs()
            ),
            Failure::File(error) => error.to_string(),
            Failure::Setup(error) => error.to_string(),
            Failure::Postgres(error) => {
                if let Some(db) = error.as_db_error() {
                    // As diesel-async reports it: the server's own words,
                    // with the settings that answer a demand for a client
                    // certificate.
                    let message = db.message();
                    if message.contains("client certificate") && tls.client.is_none() {
                        format!("{message} (sslcert and sslkey are not set)")
                    } else {
                        message.to_owned()
                    }
                } else if let Some(tls_error) = rustls_error(error) {
                    format!("TLS (sslmode={}): {}", tls.mode, explain(tls_error, tls))
                } else {
                    // "error connecting to server" alone says nothing: add
                    // why (refused, timed out, or with several hosts and
                    // target_session_attrs=read-write, the last host's
                    // "database does not allow writes").
                    match error.source() {
                        // tokio-postgres's words for a server that asks
                        // for a password the configuration has not.
                        Some(cause) if cause.to_string() == "password missing" => {
                            NO_PASSWORD_GIVEN.to_owned()
                        }
                        Some(cause) => format!("{error}: {cause}"),
                        None => error.to_string(),
                    }
                }
            }
        }
    }
}

/// The rustls error inside a tokio-postgres error, if any. tokio-rustls
/// wraps it in an `io::Error`, whose `source()` skips the wrapped error
/// itself, hence `get_ref`.
fn rustls_error(error: &tokio_postgres::Error) -> Option<&rustls::Error> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = error.source();
    while let Some(current) = next {
        if let Some(found) = current.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        if let Some(found) = current
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(found);
        }
        next = current.source();
    }
    None
}

/// A TLS failure in the words of the settings that fix it.
fn explain(error: &rustls::Error, tls: &PgTls) -> String {
    use rustls::{AlertDescription as Alert, CertificateError as Cert, Error as E};
    let roots = match &tls.root {
        RootCerts::File(path) => format!("sslrootcert {}", path.display()),
        RootCerts::System => "the bundled webpki roots (sslrootcert=system)".to_owned(),
        RootCerts::Unset => "the bundled webpki roots (no sslrootcert given)".to_owned(),
    };
    let why = match error {
        E::InvalidCertificate(Cert::UnknownIssuer) => {
            format!("the server's certificate is not signed by a CA in {roots}")
        }
        E::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => {
            "the server's certificate is not valid for the host name in DATABASE_URL \
             (verify-full checks it; verify-ca does not)"
                .to_owned()
        }
        E::InvalidCertificate(Cert::Expired | Cert::ExpiredContext { .. }) => {
            "the server's certificate has expired".to_owned()
        }
        E::InvalidCertificate(Cert::NotValidYet | Cert::NotValidYetContext { .. }) => {
            "the server's certificate is not valid yet".to_owned()
        }
        E::AlertReceived(Alert::CertificateRequired) => {
            "the server requires a client certificate (sslcert and sslkey)".to_owned()
        }
        E::AlertReceived(Alert::UnknownCA | Alert::BadCertificate | Alert::CertificateUnknown)
            if tls.client.is_some() =>
        {
            "the server refused the client certificate (sslcert)".to_owned()
        }
        _ => return error.to_string(),
    };
    format!("{why} ({error})")
}

/// Opens one connection as `DATABASE_URL` says, with libpq's semantics:
/// with several hosts, each is tried in turn (its own name checked under
/// `verify-full`) until one accepts and, with
/// `target_session_attrs=read-write`, is writable. The password file, when
/// it is the password's source, is read now (as libpq reads it for every
/// connection); when it gives the hosts different passwords each host is
/// tried on its own with its own. An authentication failure without any
/// password says where none was found.
pub async fn connect(
    url: &DatabaseUrl,
    pooler: Pooler,
) -> Result<AsyncPgConnection, ConnectionError> {
    let tls = url.tls();
    let tls_usable = cpu_supported();
    if !tls_usable && matches!(tls.mode, SslMode::Allow | SslMode::Prefer) {
        static WARNED: Once = Once::new();
        WARNED.call_once(|| {
            tracing::warn!(sslmode = %tls.mode, "this CPU cannot run the TLS library (graviola needs x86_64 with AVX2/ADX/BMI2, or aarch64); connecting to PostgreSQL without TLS");
        });
    }
    // Reads the password file, when it is the source: a small local file,
    // read in place as the certificate files are.
    let mut plan = url.connect_plan();
    // The hosts on their own in the URL's order; load_balance_hosts=random
    // shuffles them, as libpq (and tokio-postgres, for hosts in one
    // configuration) does.
    if plan.configs.len() > 1
        && url.config().get_load_balance_hosts() == tokio_postgres::config::LoadBalanceHosts::Random
    {
        fastrand::shuffle(&mut plan.configs);
    }
    let mut last = None;
    for config in &plan.configs {
        let attempt = connect_one(config, tls, tls_usable, pooler);
        let outcome = match plan.attempt_timeout {
            // libpq's connect_timeout bounds the whole attempt on a host,
            // then the next one is tried.
            Some(limit) => tokio::time::timeout(limit, attempt)
                .await
                .unwrap_or_else(|_| {
                    Err(Failure::Timeout {
                        hosts: crate::libpq::host_list(config),
                        limit,
                    })
                }),
            None => attempt.await,
        };
        match outcome {
            Ok(conn) => return Ok(conn),
            Err(failure) => last = Some(failure),
        }
    }
    let error = match last {
        Some(Failure::Setup(error)) => error,
        Some(other) => {
            let mut text = other.describe(tls);
            // Which socket file was missing or refused, as libpq says.
            if text.starts_with("error connecting to server")
                && let Some(config) = plan.configs.last()
                && let sockets = socket_files(config)
                && !sockets.is_empty()
            {
                text.push_str(&format!(" (Unix socket {})", sockets.join(", ")));
            }
            ConnectionError::BadConnection(text)
        }
        None => ConnectionError::BadConnection("no host to connect to".to_owned()),
    };
    Err(match (error, plan.no_password) {
        (ConnectionError::BadConnection(text), Some(none)) if is_about_the_password(&text) => {
            ConnectionError::BadConnection(format!("{text} ({none})"))
        }
        (error, _) => error,
    })
}

/// The socket files of `config`'s Unix-socket hosts
/// (`DIR/.s.PGSQL.PORT`, the file PostgreSQL listens on in DIR).
fn socket_files(config: &tokio_postgres::Config) -> Vec<String> {
    let ports = config.get_ports();
    config
        .get_hosts()
        .iter()
        .enumerate()
        .filter_map(|(i, host)| match host {
            tokio_postgres::config::Host::Unix(dir) => {
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                Some(format!("{}/.s.PGSQL.{port}", dir.display()))
            }
            tokio_postgres::config::Host::Tcp(_) => None,
        })
        .collect()
}

/// A server that asks for a password when none was given.
const NO_PASSWORD_GIVEN: &str = "the server asks for a password and none was given";

/// Whether a failure is the server asking for a password it did not get,
/// or refusing the one it got.
fn is_about_the_password(text: &str) -> bool {
    text.contains("password authentication failed") || text.contains(NO_PASSWORD_GIVEN)
}

/// One attempt with `config` in the `sslmode` of `tls`. libpq never uses
/// TLS over a Unix socket (`sslmode` does not apply there): every host a
/// socket, the connection is plain in every mode.
async fn connect_one(
    config: &tokio_postgres::Config,
    tls: &PgTls,
    tls_usable: bool,
    pooler: Pooler,
) -> Result<AsyncPgConnection, Failure> {
    let all_sockets = !config.get_hosts().is_empty()
        && config.get_hostaddrs().is_empty()
        && config
            .get_hosts()
            .iter()
            .all(|host| matches!(host, tokio_postgres::config::Host::Unix(_)));
    if all_sockets {
        return plain(config, pooler).await;
    }
    match tls.mode {
        SslMode::Disable => plain(config, pooler).await,
        SslMode::Allow => match plain(config, pooler).await {
            Err(first) if tls_usable && first.retry_other_mode() => {
                encrypted(config, tls, WireSslMode::Require, pooler)
                    .await
                    .map_err(|second| Failure::Setup(both(tls, &first, &second, "with TLS")))
            }
            other => other,
        },
        SslMode::Prefer if !tls_usable => plain(config, pooler).await,
        SslMode::Prefer => match encrypted(config, tls, WireSslMode::Prefer, pooler).await {
            Err(first) if first.retry_other_mode() => plain(config, pooler)
                .await
                .map_err(|second| Failure::Setup(both(tls, &first, &second, "without TLS"))),
            other => other,
        },
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            encrypted(config, tls, WireSslMode::Require, pooler).await
        }
    }
}

/// Both attempts of a libpq fallback, in one line.
fn both(tls: &PgTls, first: &Failure, second: &Failure, again: &str) -> ConnectionError {
    ConnectionError::BadConnection(format!(
        "{}; tried again {again}: {}",
        first.describe(tls),
        second.describe(tls)
    ))
}

async fn plain(
    config: &tokio_postgres::Config,
    pooler: Pooler,
) -> Result<AsyncPgConnection, Failure> {
    let mut config = config.clone();
    config.ssl_mode(WireSslMode::Disable);
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(Failure::Postgres)?;
    into_diesel(client, connection, pooler).await
}

async fn encrypted(
    config: &tokio_postgres::Config,
    tls: &PgTls,
    mode: WireSslMode,
    pooler: Pooler,
) -> Result<AsyncPgConnection, Failure> {
    let client_config = client_config(tls).map_err(Failure::File)?;
    let mut config = config.clone();
    config.ssl_mode(mode);
    let (client, connection) = config
        .connect(MakeRustlsConnect::new(client_config))
        .await
        .map_err(Failure::Postgres)?;
    into_diesel(client, connection, pooler).await
}

/// Hands a connected client to diesel-async.
///
/// Through a transaction pooler, diesel-async's own set-up (two `SET`s,
/// each prepared under a name and cached) runs inside a transaction that
/// this function opens, and the statement cache is turned off before the
/// commit, which closes those statements on the server connection that
/// prepared them: no name outlives its transaction there. The connection
/// task is then driven here (the set-up must follow the `BEGIN`), so
/// diesel-async does not see the connection's own error or notifications:
/// a broken connection reports "connection closed", and LISTEN uses a
/// session connection anyway.
async fn into_diesel<S>(
    client: tokio_postgres::Client,
    connection: tokio_postgres::Connection<tokio_postgres::Socket, S>,
    pooler: Pooler,
) -> Result<AsyncPgConnection, Failure>
where
    S: tokio_postgres::tls::TlsStream + Unpin + Send + 'static,
{
    if pooler.keeps_sessions() {
        return AsyncPgConnection::try_from_client_and_connection(client, connection)
            .await
            .map_err(Failure::Setup);
    }
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "PostgreSQL connection ended");
        }
    });
    client
        .batch_execute("BEGIN")
        .await
        .map_err(Failure::Postgres)?;
    let mut conn = AsyncPgConnection::try_from(client)
        .await
        .map_err(Failure::Setup)?;
    conn.set_prepared_statement_cache_size(CacheSize::Disabled);
    conn.batch_execute("COMMIT")
        .await
        .map_err(|e| Failure::Setup(ConnectionError::CouldntSetupConfiguration(e)))?;
    Ok(conn)
}
