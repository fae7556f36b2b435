//! The connection plan: a URL with libpq's environment and password file
//! applied, what tokio-postgres connects with, and what each new
//! connection tries (host by host when the password file gives the hosts
//! different passwords).

use std::{fmt, path::PathBuf, time::Duration};

use super::{
    LibpqError,
    env::Env,
    pgpass::{self, DEFAULT_SOCKET_DIR, FileProblem},
    ssl, url,
};

/// A PostgreSQL URL that never prints its password: parsed once, the way
/// libpq parses it ([`url`]), into the configuration tokio-postgres
/// connects with and libpq's TLS parameters ([`ssl`]), with libpq's
/// environment variables ([`Env`]) where the URL leaves a parameter
/// out, and libpq's password file when neither gives a password.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    url: url::PgUrl,
    /// What tokio-postgres connects with: the parts of `url`, libpq's TLS
    /// parameters left out (`db::tls` adds them), the password from the
    /// URL or `PGPASSWORD`.
    config: tokio_postgres::Config,
    /// With several hosts, each alone (password file lookups are per host,
    /// as in libpq), with what the file is searched by.
    hosts: Vec<HostTarget>,
    /// `PGHOST`, `PGPORT`, when the hosts or ports came from them.
    hosts_from_env: Vec<&'static str>,
    tls: ssl::PgTls,
    password: PasswordFrom,
}

/// One host of the URL on its own.
#[derive(Clone, PartialEq, Eq)]
struct HostTarget {
    /// The host as the password file is searched by: its name, socket
    /// directory or, without one, its `hostaddr`.
    host: String,
    port: u16,
    /// `config` with this host alone (empty when the URL has one host:
    /// `DatabaseUrl::config` is that).
    alone: Option<tokio_postgres::Config>,
}

/// Where the password comes from, in libpq's order: the URL, then
/// `PGPASSWORD`, then the password file.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PasswordFrom {
    Url,
    PgPassword,
    /// The password file, read again for every new connection as libpq
    /// does (`None`: no file is known, no home directory).
    PassFile(Option<PathBuf>),
}

/// Where the password of a connection made now comes from, for the
/// start-up line: never the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordSource {
    Url,
    PgPassword,
    PassFile(PathBuf),
    /// None found; the password file searched, if any, and why it was
    /// ignored, if it was.
    None {
        passfile: Option<PathBuf>,
        problem: Option<FileProblem>,
    },
}

impl fmt::Display for PasswordSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PasswordSource::Url => f.write_str("url"),
            PasswordSource::PgPassword => f.write_str("PGPASSWORD"),
            PasswordSource::PassFile(path) => write!(f, "passfile {}", path.display()),
            PasswordSource::None { .. } => f.write_str("none"),
        }
    }
}

/// What one new connection tries, in order: one configuration for every
/// host, or one per host when the password file gives them different
/// passwords or `connect_timeout` bounds each host's attempt.
/// `no_password` says why none was found, for an authentication failure.
#[derive(Debug)]
pub struct ConnectPlan<'a> {
    pub configs: Vec<std::borrow::Cow<'a, tokio_postgres::Config>>,
    pub no_password: Option<String>,
    /// The limit of each configuration's whole attempt (TCP, TLS,
    /// start-up, authentication): libpq's `connect_timeout`.
    pub attempt_timeout: Option<Duration>,
}

impl DatabaseUrl {
    /// Parses the URL and its TLS parameters, without libpq's environment
    /// (see [`Self::with_env`]). The certificate and key files they name
    /// are checked at start by `db::tls::check` (a bad file exits 2 as a
    /// bad setting does).
    pub fn parse(raw: &str) -> Result<Self, LibpqError> {
        const SETTING: &str = "DATABASE_URL";
        let url = url::PgUrl::parse(raw).map_err(|e| LibpqError::new(SETTING, e.to_string()))?;
        Self::build(url, &Env::default(), None, SETTING)
    }

    /// The same URL with libpq's environment: each variable where the URL
    /// does not give its parameter, and the password file (`PGPASSFILE`,
    /// else `~/.pgpass`) when neither the URL nor `PGPASSWORD` gives a
    /// password. Errors name `setting` (the URL's) or the variable.
    pub fn with_env(url: url::PgUrl, env: &Env, setting: &'static str) -> Result<Self, LibpqError> {
        Self::build(url, env, env.passfile(), setting)
    }

    fn build(
        url: url::PgUrl,
        env: &Env,
        passfile: Option<PathBuf>,
        setting: &'static str,
    ) -> Result<Self, LibpqError> {
        let tls_env = ssl::TlsEnv {
            sslmode: env.sslmode,
            sslrootcert: env.sslrootcert.as_deref(),
            sslcert: env.sslcert.as_deref(),
            sslkey: env.sslkey.as_deref(),
        };
        let tls = ssl::from_params(&url, &tls_env, setting)
            .map_err(|(setting, problem)| LibpqError::new(setting, problem))?;
        let parts = Parts::of(&url, env, setting)?;
        let named = |problem: String| LibpqError::new(setting, problem);
        let mut config = parts.config(None).map_err(named)?;
        let env_password = env
            .password
            .as_ref()
            .map(|p| p.expose())
            .filter(|p| !p.is_empty());
        let password = match (url.password(), env_password) {
            (Some(password), _) => {
                config.password(password.expose());
                PasswordFrom::Url
            }
            (None, Some(password)) => {
                config.password(password);
                PasswordFrom::PgPassword
            }
            (None, None) => PasswordFrom::PassFile(passfile),
        };
        let mut hosts = Vec::with_capacity(parts.count());
        for i in 0..parts.count() {
            let alone = if parts.count() > 1 {
                Some(parts.config(Some(i)).map_err(named)?)
            } else {
                None
            };
            hosts.push(HostTarget {
                host: parts.search_host(i),
                port: parts.port(i),
                alone,
            });
        }
        Ok(Self {
            url,
            config,
            hosts,
            hosts_from_env: parts.from_env,
            tls,
            password,
        })
    }

    /// The hosts connected to, `host:port` each, and the variables they
    /// came from (`127.0.0.1:5433 (PGHOST, PGPORT)`): what the start-up line
    /// shows beside the URL, which names no host that came from `PGHOST`.
    pub fn targets(&self) -> String {
        let hosts = host_list(&self.config);
        if self.hosts_from_env.is_empty() {
            hosts
        } else {
            format!("{hosts} ({})", self.hosts_from_env.join(", "))
        }
    }

    /// The configuration tokio-postgres connects with (the password from
    /// the URL or `PGPASSWORD` included, never the password file's; libpq's
    /// TLS parameters left out; its `Debug` hides the password). See
    /// [`Self::connect_plan`] for what a connection uses.
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// What a new connection made now tries: with the password file as the
    /// source, the file is read now (as libpq reads it for every
    /// connection, so a rotated file is used without a restart).
    pub fn connect_plan(&self) -> ConnectPlan<'_> {
        use std::borrow::Cow;
        let (passwords, no_password) = match &self.password {
            PasswordFrom::PassFile(passfile) => self.passfile_plan(passfile.as_deref()),
            // The URL's or PGPASSWORD's, in `config` already.
            PasswordFrom::Url | PasswordFrom::PgPassword => (vec![None; self.hosts.len()], None),
        };
        let attempt_timeout = self.attempt_timeout();
        let all_same = passwords.windows(2).all(|pair| pair[0] == pair[1]);
        // Each host on its own, in order: with different passwords from the
        // file, each with its own; and with `connect_timeout`, so that the
        // limit bounds each host's whole attempt as in libpq (tokio-postgres
        // bounds only the TCP connect: a host that accepts and never
        // answers held the others' time).
        let per_host = self.hosts.len() > 1 && (!all_same || attempt_timeout.is_some());
        let configs = if per_host {
            self.hosts
                .iter()
                .zip(passwords)
                .map(|(host, password)| {
                    let mut config = host.alone.clone().unwrap_or_else(|| self.config.clone());
                    let given = password.as_ref().map(url::Password::expose);
                    if let Some(password) = given.or(self.config.get_password()) {
                        config.password(password);
                    }
                    Cow::Owned(config)
                })
                .collect()
        } else {
            match passwords.first().cloned().flatten() {
                Some(password) => {
                    let mut config = self.config.clone();
                    config.password(password.expose());
                    vec![Cow::Owned(config)]
                }
                None => vec![Cow::Borrowed(&self.config)],
            }
        };
        ConnectPlan {
            configs,
            no_password,
            attempt_timeout,
        }
    }

    /// The password file's password for each host, read now, and why none
    /// was found, if none was.
    fn passfile_plan(
        &self,
        passfile: Option<&std::path::Path>,
    ) -> (Vec<Option<url::Password>>, Option<String>) {
        let (passwords, problem) = self.passfile_passwords(passfile);
        let no_password = passwords.iter().all(Option::is_none).then(|| {
            let file = match passfile {
                Some(path) => format!("the password file {}", path.display()),
                None => "a password file (no PGPASSFILE, no home directory)".to_owned(),
            };
            let why = problem
                .as_ref()
                .map_or_else(String::new, |p| format!(": {p}"));
            format!("no password was found in the URL, PGPASSWORD or {file}{why}")
        });
        (passwords, no_password)
    }

    /// libpq's `connect_timeout` for one host's attempt: none when unset, 0
    /// or less; at least 2 s (libpq reads 1 as 2).
    fn attempt_timeout(&self) -> Option<Duration> {
        self.config
            .get_connect_timeout()
            .map(|limit| (*limit).max(Duration::from_secs(2)))
    }

    /// The password file's password for each host (none when the file is
    /// missing or ignored), and why it was ignored.
    fn passfile_passwords(
        &self,
        passfile: Option<&std::path::Path>,
    ) -> (Vec<Option<url::Password>>, Option<FileProblem>) {
        let none = || vec![None; self.hosts.len()];
        let Some(path) = passfile else {
            return (none(), None);
        };
        let text = match pgpass::read(path) {
            Ok(Some(text)) => text,
            Ok(None) => return (none(), None),
            Err(problem) => return (none(), Some(problem)),
        };
        // No user given: the operating system's, as tokio-postgres and
        // libpq connect with.
        let os_user;
        let user = match self.config.get_user() {
            Some(user) => user,
            None => {
                os_user = whoami::username().unwrap_or_default();
                os_user.as_str()
            }
        };
        let dbname = self.config.get_dbname();
        let passwords = self
            .hosts
            .iter()
            .map(|host| {
                text.lookup(&pgpass::Key {
                    host: &host.host,
                    port: host.port,
                    dbname,
                    user,
                })
            })
            .collect();
        (passwords, None)
    }

    /// Where the password of a connection made now would come from (the
    /// password file is read for this), for the start-up line.
    pub fn password_source(&self) -> PasswordSource {
        match &self.password {
            PasswordFrom::Url => PasswordSource::Url,
            PasswordFrom::PgPassword => PasswordSource::PgPassword,
            PasswordFrom::PassFile(passfile) => {
                let (passwords, problem) = self.passfile_passwords(passfile.as_deref());
                match passfile {
                    Some(path) if passwords.iter().any(Option::is_some) => {
                        PasswordSource::PassFile(path.clone())
                    }
                    _ => PasswordSource::None {
                        passfile: passfile.clone(),
                        problem,
                    },
                }
            }
        }
    }

    /// Whether the URL asks for a writable server
    /// (`target_session_attrs=read-write`).
    pub fn wants_read_write(&self) -> bool {
        self.config.get_target_session_attrs()
            == tokio_postgres::config::TargetSessionAttrs::ReadWrite
    }

    /// The TLS settings of the URL.
    pub fn tls(&self) -> &ssl::PgTls {
        &self.tls
    }

    /// The URL with the password replaced, for logs, rebuilt from the
    /// parsed parts ([`url::PgUrl::redacted`]).
    pub fn redacted(&self) -> String {
        self.url.redacted()
    }
}

/// The parts of the tokio-postgres configuration, libpq's environment
/// applied: the hosts, ports and hostaddrs (one per host, or one for all),
/// and every other parameter but libpq's TLS ones.
struct Parts {
    hosts: Vec<String>,
    ports: Vec<String>,
    hostaddrs: Vec<String>,
    rest: Vec<(String, String)>,
    /// `PGHOST`, `PGPORT`: the variables the hosts and ports came from.
    from_env: Vec<&'static str>,
}

impl Parts {
    /// A `host` or `port` parameter replaces the authority's, as in libpq;
    /// a variable applies only where the URL gives neither. With no host
    /// anywhere (and no `hostaddr`), libpq's default socket directory.
    fn of(url: &url::PgUrl, env: &Env, setting: &'static str) -> Result<Self, LibpqError> {
        let list = |text: &str| -> Vec<String> { text.split(',').map(str::to_owned).collect() };
        fn set(value: &Option<String>) -> Option<&str> {
            value.as_deref().filter(|v| !v.is_empty())
        }
        let param = |key: &str| url.param(key).filter(|v| !v.is_empty());
        let hostaddrs = param("hostaddr").map(list).unwrap_or_default();
        let (hosts, hosts_from) = if let Some(hosts) = param("host") {
            (list(hosts), setting)
        } else if !url.hosts.is_empty() {
            (url.hosts.iter().map(|h| h.name.clone()).collect(), setting)
        } else if let Some(hosts) = set(&env.host) {
            (list(hosts), "PGHOST")
        } else if hostaddrs.is_empty() {
            (vec![DEFAULT_SOCKET_DIR.to_owned()], setting)
        } else {
            (Vec::new(), setting)
        };
        if hosts.iter().any(String::is_empty) {
            return Err(LibpqError::new(hosts_from, "has no host"));
        }
        let (ports, ports_from) = if let Some(ports) = param("port") {
            (list(ports), setting)
        } else if url.hosts.iter().any(|h| h.port.is_some()) {
            let ports = url.hosts.iter();
            let ports = ports.map(|h| h.port.map_or_else(String::new, |p| p.to_string()));
            (ports.collect(), setting)
        } else if let Some(ports) = set(&env.port) {
            (list(ports), "PGPORT")
        } else {
            (Vec::new(), setting)
        };
        let count = hosts.len().max(hostaddrs.len());
        if !hosts.is_empty() && !hostaddrs.is_empty() && hosts.len() != hostaddrs.len() {
            return Err(LibpqError::new(
                setting,
                format!(
                    "{} hosts but {} hostaddr values (one per host)",
                    hosts.len(),
                    hostaddrs.len()
                ),
            ));
        }
        if ports.len() > 1 && ports.len() != count {
            return Err(LibpqError::new(
                ports_from,
                format!(
                    "{} ports for {count} hosts (one port, or one per host)",
                    ports.len()
                ),
            ));
        }
        let mut rest: Vec<(String, String)> = Vec::new();
        if let Some(user) = url.user().or(set(&env.user)) {
            rest.push(("user".into(), user.to_owned()));
        }
        if let Some(dbname) = url.dbname().or(set(&env.dbname)) {
            rest.push(("dbname".into(), dbname.to_owned()));
        }
        for (key, variable) in [
            ("application_name", &env.appname),
            ("connect_timeout", &env.connect_timeout),
        ] {
            if url.param(key).is_none()
                && let Some(value) = set(variable)
            {
                rest.push((key.into(), value.to_owned()));
            }
        }
        for (key, value) in &url.params {
            let url::Value::Text(value) = value else {
                continue;
            };
            if ssl::TLS_PARAMETERS.contains(&key.as_str())
                || matches!(
                    key.as_str(),
                    "user" | "dbname" | "host" | "port" | "hostaddr"
                )
            {
                continue;
            }
            rest.push((key.clone(), value.clone()));
        }
        let from_env = [hosts_from, ports_from]
            .into_iter()
            .filter(|from| from.starts_with("PG"))
            .collect();
        Ok(Self {
            hosts,
            ports,
            hostaddrs,
            rest,
            from_env,
        })
    }

    /// How many hosts (a host, or a `hostaddr` alone, each).
    fn count(&self) -> usize {
        self.hosts.len().max(self.hostaddrs.len())
    }

    /// Host `i` as the password file is searched by.
    fn search_host(&self, i: usize) -> String {
        self.hosts
            .get(i)
            .or_else(|| self.hostaddrs.get(i))
            .cloned()
            .unwrap_or_default()
    }

    /// Host `i`'s port.
    fn port(&self, i: usize) -> u16 {
        self.ports
            .get(i)
            .or_else(|| self.ports.first())
            .and_then(|p| p.parse().ok())
            .unwrap_or(pgpass::DEFAULT_PORT)
    }

    /// The configuration of every host, or of host `only` alone, given to
    /// tokio-postgres as a key=value string of quoted values (its parser
    /// applies each parameter as libpq would). The password is set apart
    /// (it never goes into a string).
    fn config(&self, only: Option<usize>) -> Result<tokio_postgres::Config, String> {
        fn quoted(value: &str) -> String {
            format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
        }
        let pick = |values: &[String]| -> Vec<String> {
            match only {
                None => values.to_vec(),
                Some(i) => values
                    .get(i)
                    .or_else(|| values.first().filter(|_| values.len() == 1))
                    .cloned()
                    .into_iter()
                    .collect(),
            }
        };
        let mut pairs: Vec<(&str, String)> = Vec::new();
        for (key, values) in [
            ("host", pick(&self.hosts)),
            ("port", pick(&self.ports)),
            ("hostaddr", pick(&self.hostaddrs)),
        ] {
            if !values.is_empty() {
                pairs.push((key, values.join(",")));
            }
        }
        pairs.extend(self.rest.iter().map(|(k, v)| (k.as_str(), v.clone())));
        let text: Vec<String> = pairs
            .iter()
            .map(|(key, value)| format!("{key}={}", quoted(value)))
            .collect();
        // tokio-postgres's errors name the option, never its value.
        text.join(" ")
            .parse::<tokio_postgres::Config>()
            .map_err(|e| {
                let cause =
                    std::error::Error::source(&e).map_or_else(String::new, |c| format!(" ({c})"));
                format!("{e}{cause}")
            })
    }
}

/// `config`'s hosts as `host:port` (a socket directory for a Unix socket,
/// the `hostaddr` of a host given by address alone), joined by commas.
pub fn host_list(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let ports = config.get_ports();
    let port = |i: usize| {
        ports
            .get(i)
            .or(ports.first())
            .copied()
            .unwrap_or(pgpass::DEFAULT_PORT)
    };
    let named = config.get_hosts().iter().map(|host| match host {
        Host::Tcp(name) => name.clone(),
        Host::Unix(dir) => dir.display().to_string(),
    });
    let names: Vec<String> = if config.get_hosts().is_empty() {
        config
            .get_hostaddrs()
            .iter()
            .map(ToString::to_string)
            .collect()
    } else {
        named.collect()
    };
    let hosts: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, name)| format!("{name}:{}", port(i)))
        .collect();
    hosts.join(",")
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}
#[cfg(test)]
mod tests {
    use std::{os::unix::fs::PermissionsExt as _, path::Path};

    use tokio_postgres::config::Host;

    use super::super::{ssl::SslMode, url::Password};
    use super::*;

    fn with(raw: &str, env: &Env) -> Result<DatabaseUrl, LibpqError> {
        let url =
            url::PgUrl::parse(raw).map_err(|e| LibpqError::new("DATABASE_URL", e.to_string()))?;
        DatabaseUrl::with_env(url, env, "DATABASE_URL")
    }

    fn url(raw: &str, env: &Env) -> DatabaseUrl {
        with(raw, env).unwrap_or_else(|e| panic!("{raw}: {e}"))
    }

    fn hosts(url: &DatabaseUrl) -> Vec<Host> {
        url.config().get_hosts().to_vec()
    }

    fn unix(path: &str) -> Host {
        Host::Unix(path.into())
    }

    /// A password file in a folder of its own, 0600.
    fn passfile(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pgpass-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pgpass");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    fn file_env(path: &Path) -> Env {
        Env {
            passfile: Some(path.to_owned()),
            ..Env::default()
        }
    }

    fn passwords(url: &DatabaseUrl) -> Vec<Option<Vec<u8>>> {
        url.connect_plan()
            .configs
            .iter()
            .map(|c| c.get_password().map(<[u8]>::to_vec))
            .collect()
    }

    #[test]
    fn socket_hosts_in_libpqs_three_forms() {
        let none = Env::default();
        // No host: Debian's libpq default socket directory.
        for raw in ["postgres:///crm", "postgresql://app@/crm"] {
            assert_eq!(
                hosts(&url(raw, &none)),
                [unix("/var/run/postgresql")],
                "{raw}"
            );
        }
        assert_eq!(
            url("postgres:///crm", &none).config().get_dbname(),
            Some("crm")
        );
        assert_eq!(
            hosts(&url("postgres:///crm?host=/srv/pg&port=5433", &none)),
            [unix("/srv/pg")]
        );
        assert_eq!(
            url("postgres:///crm?host=/srv/pg&port=5433", &none)
                .config()
                .get_ports(),
            [5433]
        );
        assert_eq!(
            hosts(&url("postgres://%2Fvar%2Frun%2Fpostgresql/crm", &none)),
            [unix("/var/run/postgresql")]
        );
        assert_eq!(
            hosts(&url("postgres://app@%2Fsrv%2Fpg:5433/crm", &none)),
            [unix("/srv/pg")]
        );
        // PGHOST where the URL has no host; the URL's host wins.
        let pghost = Env {
            host: Some("/srv/pg".into()),
            ..Env::default()
        };
        assert_eq!(hosts(&url("postgres:///crm", &pghost)), [unix("/srv/pg")]);
        assert_eq!(
            hosts(&url("postgres://db/crm", &pghost)),
            [Host::Tcp("db".into())]
        );
        assert_eq!(
            hosts(&url("postgres:///crm?host=/other", &pghost)),
            [unix("/other")]
        );
        // hostaddr alone is a host, as in libpq: no default directory.
        let url = url("postgres:///crm?hostaddr=127.0.0.1", &none);
        assert!(hosts(&url).is_empty());
        // No host in a list is still refused.
        let error = with("postgres://a,/crm", &none).unwrap_err();
        assert_eq!(error.setting, "DATABASE_URL");
    }

    #[test]
    fn the_url_wins_over_the_variables() {
        let env = Env {
            host: Some("env-host".into()),
            port: Some("6000".into()),
            dbname: Some("env_db".into()),
            user: Some("env_user".into()),
            password: Some(Password::new("env-pw")),
            appname: Some("env-app".into()),
            connect_timeout: Some("7".into()),
            ..Env::default()
        };
        let full = url(
            "postgres://u:url-pw@h:5000/d?application_name=a&connect_timeout=3",
            &env,
        );
        let config = full.config();
        assert_eq!(config.get_hosts(), [Host::Tcp("h".into())]);
        assert_eq!(config.get_ports(), [5000]);
        assert_eq!(config.get_user(), Some("u"));
        assert_eq!(config.get_dbname(), Some("d"));
        assert_eq!(config.get_password(), Some(&b"url-pw"[..]));
        assert_eq!(config.get_application_name(), Some("a"));
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(full.password_source(), PasswordSource::Url);

        let bare = url("postgres://", &env);
        let config = bare.config();
        assert_eq!(config.get_hosts(), [Host::Tcp("env-host".into())]);
        assert_eq!(config.get_ports(), [6000]);
        assert_eq!(config.get_user(), Some("env_user"));
        assert_eq!(config.get_dbname(), Some("env_db"));
        assert_eq!(config.get_password(), Some(&b"env-pw"[..]));
        assert_eq!(config.get_application_name(), Some("env-app"));
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(7)));
        assert_eq!(bare.password_source(), PasswordSource::PgPassword);
        assert_eq!(bare.password_source().to_string(), "PGPASSWORD");
        // A port in the authority for any host, or a port parameter, wins
        // over PGPORT for every host (libpq's port list).
        assert_eq!(
            url("postgres://h1:5001,h2/d", &env).config().get_ports(),
            [5001, 5432]
        );
        assert_eq!(url("postgres://h1,h2/d", &env).config().get_ports(), [6000]);
        // An empty variable counts as unset.
        let empty = Env {
            password: Some(Password::new("")),
            user: Some(String::new()),
            ..Env::default()
        };
        let bare = url("postgres://h/d", &empty);
        assert_eq!(bare.config().get_password(), None);
        assert_eq!(bare.config().get_user(), None);
    }

    #[test]
    fn pgssl_variables_fill_in_what_the_url_leaves_out() {
        let env = Env {
            sslmode: Some(SslMode::VerifyFull),
            sslrootcert: Some("/env/ca.pem".into()),
            sslcert: Some("/env/c.pem".into()),
            sslkey: Some("/env/k.pem".into()),
            ..Env::default()
        };
        let tls = url("postgres://h/d", &env).tls().clone();
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root, ssl::RootCerts::File("/env/ca.pem".into()));
        let client = tls.client.clone().expect("a client certificate");
        assert_eq!(client.cert, PathBuf::from("/env/c.pem"));
        assert_eq!(client.key, PathBuf::from("/env/k.pem"));
        assert_eq!(tls.setting_of("sslkey", "DATABASE_URL"), "PGSSLKEY");
        assert_eq!(tls.setting_of("sslmode", "DATABASE_URL"), "PGSSLMODE");
        // The URL's parameters win, one by one.
        let tls = url("postgres://h/d?sslmode=require&sslkey=/url/k.pem", &env)
            .tls()
            .clone();
        assert_eq!(tls.mode, SslMode::Require);
        assert_eq!(tls.root, ssl::RootCerts::File("/env/ca.pem".into()));
        let client = tls.client.clone().expect("a client certificate");
        assert_eq!(client.cert, PathBuf::from("/env/c.pem"));
        assert_eq!(client.key, PathBuf::from("/url/k.pem"));
        assert_eq!(tls.setting_of("sslkey", "DATABASE_URL"), "DATABASE_URL");
        assert_eq!(tls.setting_of("sslcert", "DATABASE_URL"), "PGSSLCERT");
        // PGSSLROOTCERT=system makes verify-full the default, as the
        // parameter does.
        let system = Env {
            sslrootcert: Some("system".into()),
            ..Env::default()
        };
        assert_eq!(
            url("postgres://h/d", &system).tls().mode,
            SslMode::VerifyFull
        );
    }

    #[test]
    fn errors_name_the_variable_a_value_came_from() {
        let cert_only = Env {
            sslcert: Some("/env/c.pem".into()),
            ..Env::default()
        };
        let error = with("postgres://u:s3cret@h/d", &cert_only).unwrap_err();
        assert_eq!(error.setting, "PGSSLCERT");
        assert!(!error.to_string().contains("s3cret"));
        let verify_ca = Env {
            sslmode: Some(SslMode::VerifyCa),
            ..Env::default()
        };
        let error = with("postgres://h/d", &verify_ca).unwrap_err();
        assert_eq!(error.setting, "PGSSLMODE");
        assert!(error.problem.contains("needs sslrootcert=FILE"), "{error}");
        let ports = Env {
            port: Some("1,2,3".into()),
            ..Env::default()
        };
        let error = with("postgres://h1,h2/d", &ports).unwrap_err();
        assert_eq!(error.setting, "PGPORT");
        let hosts = Env {
            host: Some("a,,b".into()),
            ..Env::default()
        };
        assert_eq!(with("postgres:///d", &hosts).unwrap_err().setting, "PGHOST");
    }

    #[test]
    fn the_password_file_comes_last_and_is_read_per_host() {
        let path = passfile(
            "precedence",
            "h1:5432:d:u:file-pw-1\nh2:5432:d:u:file-pw-2\nsame:*:*:u:same\nlocalhost:5432:*:u:local\n",
        );
        let env = file_env(&path);
        // The URL and PGPASSWORD win over the file.
        assert_eq!(
            passwords(&url("postgres://u:url-pw@h1/d", &env)),
            [Some(b"url-pw".to_vec())]
        );
        let with_pgpassword = Env {
            password: Some(Password::new("env-pw")),
            ..env.clone()
        };
        assert_eq!(
            passwords(&url("postgres://u@h1/d", &with_pgpassword)),
            [Some(b"env-pw".to_vec())]
        );
        // The file's, for the one host.
        let one = url("postgres://u@h1/d", &env);
        assert_eq!(passwords(&one), [Some(b"file-pw-1".to_vec())]);
        assert_eq!(one.config().get_password(), None, "never kept");
        assert_eq!(
            one.password_source(),
            PasswordSource::PassFile(path.clone())
        );
        assert_eq!(
            one.password_source().to_string(),
            format!("passfile {}", path.display())
        );
        // Two hosts with different passwords: each on its own.
        let two = url("postgres://u@h1,h2/d", &env);
        let plan = two.connect_plan();
        assert_eq!(plan.configs.len(), 2);
        assert_eq!(plan.configs[0].get_hosts(), [Host::Tcp("h1".into())]);
        assert_eq!(plan.configs[1].get_hosts(), [Host::Tcp("h2".into())]);
        assert_eq!(
            passwords(&two),
            [Some(b"file-pw-1".to_vec()), Some(b"file-pw-2".to_vec())]
        );
        // With load_balance_hosts=random too, in the URL's order.
        let random = url("postgres://u@h2,h1/d?load_balance_hosts=random", &env);
        assert_eq!(
            passwords(&random),
            [Some(b"file-pw-2".to_vec()), Some(b"file-pw-1".to_vec())]
        );
        // The same password for every host: one configuration.
        let same = url("postgres://u@same:5433,same:5434/d", &env);
        assert_eq!(passwords(&same), [Some(b"same".to_vec())]);
        assert_eq!(same.connect_plan().configs[0].get_hosts().len(), 2);
        // A socket URL without a host, and libpq's default directory, are
        // `localhost` in the file.
        for raw in [
            "postgres://u@/d",
            "postgres://u@%2Fvar%2Frun%2Fpostgresql/d",
        ] {
            assert_eq!(
                passwords(&url(raw, &env)),
                [Some(b"local".to_vec())],
                "{raw}"
            );
        }
        // No match: none, and an authentication failure will say where
        // none was found.
        let none = url("postgres://other@h1/d", &env);
        assert_eq!(passwords(&none), [None]);
        assert_eq!(
            none.connect_plan().no_password,
            Some(format!(
                "no password was found in the URL, PGPASSWORD or the password file {}",
                path.display()
            ))
        );
        assert_eq!(none.password_source().to_string(), "none");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_password_file_others_may_read_is_ignored() {
        let path = passfile("open", "*:*:*:*:s3cret-of-file\n");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let open = url("postgres://u@h/d", &file_env(&path));
        assert_eq!(passwords(&open), [None]);
        let source = open.password_source();
        let PasswordSource::None {
            problem: Some(problem),
            ..
        } = &source
        else {
            panic!("{source:?}");
        };
        assert!(problem.to_string().contains("mode 0644"), "{problem}");
        let hint = open.connect_plan().no_password.expect("a hint");
        assert!(
            hint.contains("has group or world access (mode 0644)"),
            "{hint}"
        );
        assert!(!hint.contains("s3cret") && !format!("{source:?}").contains("s3cret"));
        // Read again for every connection: fixed, it is used.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(passwords(&open), [Some(b"s3cret-of-file".to_vec())]);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn without_the_environment_no_file_is_read() {
        let url = DatabaseUrl::parse("postgres://u@h/d").unwrap();
        assert_eq!(passwords(&url), [None]);
        assert_eq!(
            url.password_source(),
            PasswordSource::None {
                passfile: None,
                problem: None
            }
        );
    }

    #[test]
    fn database_url_errors_never_echo_the_password() {
        for raw in [
            "mysql://u:s3cret@h/db",
            "postgres://u:s3cret@h,/db",
            "not a url s3cret",
            "postgres://u:s3cret@h:99999/db",
        ] {
            let err = DatabaseUrl::parse(raw).unwrap_err();
            assert_eq!(err.setting, "DATABASE_URL");
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
        let url = DatabaseUrl::parse("postgres://u:s3cret@h:5432/db").unwrap();
        assert!(!format!("{url:?}").contains("s3cret"));
    }

    /// Issue 25's defects, through the settings type: the password printed
    /// when it held a '/', and `sslmode` lost after a '?' in the password.
    #[test]
    fn issue_25_passwords_are_redacted_and_sslmode_read() {
        for (raw, password) in [
            ("postgres://app:ab/cd+ef==@host/booking", "ab/cd+ef=="),
            ("postgres://app:a?b@host/booking?sslmode=require", "a?b"),
            ("postgres://app:p@ss@host/booking?sslmode=require", "p@ss"),
            ("postgres://app:x#y z@host/booking?sslmode=require", "x#y z"),
        ] {
            let url = DatabaseUrl::parse(raw).unwrap_or_else(|e| panic!("{raw}: {e}"));
            assert!(!url.redacted().contains(password), "{}", url.redacted());
            assert!(!format!("{url:?}").contains(password), "{url:?}");
            assert!(
                url.redacted()
                    .starts_with("postgres://app:***@host/booking"),
                "{}",
                url.redacted()
            );
            if raw.contains("sslmode=require") {
                assert_eq!(url.tls().mode, SslMode::Require, "{raw}");
            }
        }
    }

    #[test]
    fn database_url_parameters_tokio_postgres_refuses_are_named() {
        for option in ["sslsni", "gssencmode", "sslpassword", "service", "passfile"] {
            let err =
                DatabaseUrl::parse(&format!("postgres://u:s3cret@h/db?{option}=1")).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("DATABASE_URL: invalid connection string (unknown option `{option}`)")
            );
        }
        let err =
            DatabaseUrl::parse("postgres://u:s3cret@h/db?connect_timeout=s3cret").unwrap_err();
        assert!(err.problem.contains("`connect_timeout`"), "{err}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
        let url =
            DatabaseUrl::parse("postgres://u:s3cret@h/db?sslmode=verify-full&application_name=x")
                .unwrap();
        let config = url.config();
        assert_eq!(config.get_application_name(), Some("x"));
        assert_eq!(config.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(config.get_dbname(), Some("db"));
        assert!(!format!("{url:?}").contains("s3cret"));
        assert!(!format!("{config:?}").contains("s3cret"));
    }

    #[test]
    fn multi_host_urls_parse_and_never_print_the_password() {
        let raw = "postgres://u:s3cret@h1:5433,h2:5434/db?target_session_attrs=read-write\
                   &sslmode=verify-full&application_name=x";
        let url = DatabaseUrl::parse(raw).unwrap();
        assert_eq!(url.tls().mode, SslMode::VerifyFull);
        let config = url.config();
        assert_eq!(config.get_application_name(), Some("x"));
        assert_eq!(config.get_user(), Some("u"));
        assert_eq!(config.get_hosts().len(), 2);
        assert_eq!(config.get_ports(), [5433, 5434]);
        assert_eq!(
            config.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        assert!(url.wants_read_write());
        assert!(
            !DatabaseUrl::parse("postgres://u@h1,h2/db")
                .unwrap()
                .wants_read_write()
        );
        assert_eq!(
            url.redacted(),
            "postgres://u:***@h1:5433,h2:5434/db?target_session_attrs=read-write\
             &sslmode=verify-full&application_name=x"
        );
        assert!(!format!("{url:?}").contains("s3cret"));
        for bad in [
            "postgres://u:s3cret@h1:5433,h2:99999/db",
            "postgres://u:s3cret@h1,/db",
            "postgres://u:s3cret@h1,h2/db?target_session_attrs=primary-ish",
        ] {
            let error = DatabaseUrl::parse(bad).unwrap_err();
            assert!(!error.to_string().contains("s3cret"), "{error}");
        }
        let url = DatabaseUrl::parse("postgres://u@h/db?password=s3cret&user=v").unwrap();
        assert_eq!(url.redacted(), "postgres://u@h/db?password=***&user=v");
    }

    /// `connect_timeout` bounds each host's attempt on its own (libpq's
    /// rule): several hosts are tried one by one, each with the URL's
    /// password, and 1 s is libpq's 2 s.
    #[test]
    fn connect_timeout_splits_the_hosts_and_bounds_each() {
        let none = Env::default();
        let plan_of = |raw: &str| {
            let url = url(raw, &none);
            let plan = url.connect_plan();
            let hosts: Vec<Vec<Host>> = plan
                .configs
                .iter()
                .map(|c| c.get_hosts().to_vec())
                .collect();
            let passwords: Vec<Option<Vec<u8>>> = plan
                .configs
                .iter()
                .map(|c| c.get_password().map(<[u8]>::to_vec))
                .collect();
            (hosts, passwords, plan.attempt_timeout)
        };
        let (hosts, passwords, limit) = plan_of("postgres://u:pw@h1,h2:5433/d?connect_timeout=1");
        assert_eq!(
            hosts,
            [vec![Host::Tcp("h1".into())], vec![Host::Tcp("h2".into())]]
        );
        assert_eq!(passwords, [Some(b"pw".to_vec()), Some(b"pw".to_vec())]);
        assert_eq!(limit, Some(Duration::from_secs(2)));
        let (hosts, _, limit) = plan_of("postgres://u:pw@h1,h2/d?connect_timeout=7");
        assert_eq!(hosts.len(), 2);
        assert_eq!(limit, Some(Duration::from_secs(7)));
        // Without it, one configuration for every host (tokio-postgres tries
        // them in turn), and no limit of its own.
        let (hosts, _, limit) = plan_of("postgres://u:pw@h1,h2/d");
        assert_eq!(
            hosts,
            [vec![Host::Tcp("h1".into()), Host::Tcp("h2".into())]]
        );
        assert_eq!(limit, None);
        for off in ["0", "-5"] {
            let (hosts, _, limit) = plan_of(&format!("postgres://u@h1,h2/d?connect_timeout={off}"));
            assert_eq!((hosts.len(), limit), (1, None), "{off}");
        }
        // One host: one configuration, bounded.
        let (hosts, _, limit) = plan_of("postgres://u:pw@h1/d?connect_timeout=3");
        assert_eq!((hosts.len(), limit), (1, Some(Duration::from_secs(3))));
    }
}
