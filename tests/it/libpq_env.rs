//! libpq's environment and password file, and Unix-socket hosts, against
//! the real binary and PostgreSQL: each password source (the URL,
//! `PGPASSWORD`, `PGPASSFILE`, `~/.pgpass` through `HOME`) connects and is
//! named in the command's first line, never the password; libpq's
//! precedence (the URL, then the variable, then the file); a password file
//! others may read is ignored with a warning naming it and its mode; an
//! authentication failure without a password says where none was found;
//! `PGHOST`/`PGPORT`/`PGUSER`/`PGDATABASE`/`PGAPPNAME` fill in what the URL
//! leaves out; bad values exit 2 naming the variable; and a PostgreSQL that
//! listens on a Unix socket only (`listen_addresses = ''`) is reachable in
//! each of libpq's socket forms.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use booking_expiration::libpq::url::percent_encode;
use testkit::postgres::Postgres;

use crate::support::*;

/// Environment variables of one run: (name, value).
type Vars<'a> = &'a [(&'a str, &'a str)];

/// Runs the binary with `env` (logs as text at info); (exit code, stdout,
/// stderr).
fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let output = binary()
        .args(args)
        .env("DATABASE_CONNECT_TIMEOUT", "5s")
        .envs(env.iter().copied())
        .output()
        .expect("run the binary");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The operating system's user name (of the process's uid).
fn whoami_user() -> String {
    let output = std::process::Command::new("id")
        .arg("-un")
        .output()
        .expect("id -un");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A `.pgpass` line's field, escaped as libpq reads it.
fn field(text: &str) -> String {
    text.replace('\\', "\\\\").replace(':', "\\:")
}

/// Writes a password file with `lines` in `dir` under `name`, mode `mode`.
fn pgpass(dir: &Path, name: &str, lines: &[String], mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").expect("write the password file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

/// A role with a password and the worker's grants on a fresh database of
/// the test PostgreSQL, reached over TCP.
struct Target {
    db: TestDb,
    _roles: TestRoles,
    role: String,
    password: &'static str,
    host: String,
    port: u16,
}

impl Target {
    async fn new() -> Self {
        const PASSWORD: &str = "pw-libpq:env\\Zq7";
        let roles = TestRoles::create(&[("libpq", &format!("LOGIN PASSWORD '{PASSWORD}'"))]).await;
        let role = roles.names[0].clone();
        let db = TestDb::new().await;
        db.grant_worker(&db.url, &role).await;
        let base = url::Url::parse(&db.url).expect("the test database's URL");
        Self {
            role,
            password: PASSWORD,
            host: base.host_str().expect("a host").to_owned(),
            port: base.port().expect("a port"),
            db,
            _roles: roles,
        }
    }

    /// The URL without a password.
    fn url(&self) -> String {
        format!(
            "postgres://{}@{}:{}/{}",
            self.role, self.host, self.port, self.db.name
        )
    }

    /// The URL with `password`.
    fn url_with(&self, password: &str) -> String {
        format!(
            "postgres://{}:{}@{}:{}/{}",
            self.role,
            percent_encode(password),
            self.host,
            self.port,
            self.db.name
        )
    }

    /// A `.pgpass` line for this role's connection with `password`.
    fn line(&self, password: &str) -> String {
        format!(
            "{}:{}:{}:{}:{}",
            self.host,
            self.port,
            self.db.name,
            self.role,
            field(password)
        )
    }
}

/// `status` exits 0 and names `source` as the password's origin, without
/// the password.
fn assert_connects(target: &Target, env: &[(&str, &str)], source: &str) {
    let (code, stdout, stderr) = run(&["status", "--json"], env);
    assert_eq!(code, Some(0), "{source}: {stderr}");
    assert!(stdout.contains("\"outbox_unpublished\""), "{stdout}");
    assert!(
        stderr.contains(&format!("password={source}")),
        "password={source} in: {stderr}"
    );
    assert!(!stderr.contains(target.password), "{stderr}");
}

/// One test per source: the URL, PGPASSWORD, PGPASSFILE and ~/.pgpass
/// (through HOME); a 0644 file is ignored with its warning; with no
/// password anywhere the failure says where none was found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_password_source_connects_and_is_named() {
    let target = Target::new().await;
    let files = tempdir("pgpass");
    let url = target.url();

    assert_connects(
        &target,
        &[("DATABASE_URL", &target.url_with(target.password))],
        "url",
    );
    assert_connects(
        &target,
        &[("DATABASE_URL", &url), ("PGPASSWORD", target.password)],
        "PGPASSWORD",
    );
    let file = pgpass(&files, "pgpass", &[target.line(target.password)], 0o600);
    let file_text = file.display().to_string();
    assert_connects(
        &target,
        &[("DATABASE_URL", &url), ("PGPASSFILE", &file_text)],
        &format!("passfile {file_text}"),
    );
    // ~/.pgpass, HOME pointing at a home of the test's own; wildcards and
    // a comment in the file, the first matching line wins.
    let home = tempdir("pgpass-home");
    let dot = pgpass(
        &home,
        ".pgpass",
        &[
            "# hostname:port:database:username:password".to_owned(),
            format!(
                "{}:*:*:{}:{}",
                target.host,
                target.role,
                field(target.password)
            ),
            format!("*:*:*:{}:not-this-one", target.role),
        ],
        0o600,
    );
    let home_text = home.display().to_string();
    assert_connects(
        &target,
        &[("DATABASE_URL", &url), ("HOME", &home_text)],
        &format!("passfile {}", dot.display()),
    );

    // 0644: ignored, with a warning naming the file and its mode, and the
    // failure says why no password was found.
    std::fs::set_permissions(&dot, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, _, stderr) = run(&["status"], &[("DATABASE_URL", &url), ("HOME", &home_text)]);
    assert_eq!(code, Some(1), "{stderr}");
    let warning = format!(
        "password file {} has group or world access (mode 0644)",
        dot.display()
    );
    let warned = stderr
        .lines()
        .find(|line| line.contains(&warning))
        .unwrap_or_else(|| panic!("{warning:?} in: {stderr}"));
    assert!(warned.contains("WARN"), "{warned}");
    assert!(stderr.contains("password=none"), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains(&format!(
            "cannot connect to PostgreSQL at DATABASE_URL: the server asks for a password and \
             none was given (no password was found in the URL, PGPASSWORD or the password file {}: {warning}",
            dot.display()
        )),
        "{last}"
    );
    assert!(!stderr.contains(target.password), "{stderr}");

    // No password anywhere: the default file is named.
    let (code, _, stderr) = run(&["status"], &[("DATABASE_URL", &url)]);
    assert_eq!(code, Some(1), "{stderr}");
    let default = empty_home().join(".pgpass");
    assert!(
        stderr.contains(&format!(
            "none was given (no password was found in the URL, PGPASSWORD or the password file {})",
            default.display()
        )),
        "{stderr}"
    );
    // A wrong password from the file says so too, with where it looked.
    let wrong = pgpass(&files, "wrong", &[target.line("not-the-password")], 0o600);
    let (code, _, stderr) = run(
        &["status"],
        &[
            ("DATABASE_URL", &url),
            ("PGPASSFILE", &wrong.display().to_string()),
        ],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-password"), "{stderr}");
}

/// libpq's order: a password in the URL wins over PGPASSWORD, which wins
/// over the password file. Each wrong one in first place fails, so the
/// order is the cause, not a fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_wins_then_pgpassword_then_the_file() {
    let target = Target::new().await;
    let files = tempdir("pgpass-order");
    let right_file = pgpass(&files, "right", &[target.line(target.password)], 0o600);
    let wrong_file = pgpass(&files, "wrong", &[target.line("wrong-in-file")], 0o600);
    let (right_file, wrong_file) = (
        right_file.display().to_string(),
        wrong_file.display().to_string(),
    );
    let right_url = target.url_with(target.password);
    let wrong_url = target.url_with("wrong-in-url");
    let bare = target.url();
    let cases: [(&str, Vars<'_>, Option<&str>); 5] = [
        (
            "the URL's, beside a wrong PGPASSWORD and file",
            &[
                ("DATABASE_URL", &right_url),
                ("PGPASSWORD", "wrong-in-env"),
                ("PGPASSFILE", &wrong_file),
            ],
            Some("url"),
        ),
        (
            "a wrong URL password, beside the right PGPASSWORD",
            &[
                ("DATABASE_URL", &wrong_url),
                ("PGPASSWORD", target.password),
                ("PGPASSFILE", &right_file),
            ],
            None,
        ),
        (
            "PGPASSWORD, beside a wrong file",
            &[
                ("DATABASE_URL", &bare),
                ("PGPASSWORD", target.password),
                ("PGPASSFILE", &wrong_file),
            ],
            Some("PGPASSWORD"),
        ),
        (
            "a wrong PGPASSWORD, beside the right file",
            &[
                ("DATABASE_URL", &bare),
                ("PGPASSWORD", "wrong-in-env"),
                ("PGPASSFILE", &right_file),
            ],
            None,
        ),
        (
            "an empty PGPASSWORD counts as unset",
            &[
                ("DATABASE_URL", &bare),
                ("PGPASSWORD", ""),
                ("PGPASSFILE", &right_file),
            ],
            Some("passfile"),
        ),
    ];
    // The file is searched per host: two names of the same server, the
    // first with a wrong password, the second with the right one; the
    // second host connects with its own.
    let per_host = pgpass(
        &files,
        "per-host",
        &[
            format!(
                "127.0.0.1:{}:*:{}:wrong-for-this-host",
                target.port, target.role
            ),
            format!(
                "localhost:{}:*:{}:{}",
                target.port,
                target.role,
                field(target.password)
            ),
        ],
        0o600,
    );
    let two_hosts = format!(
        "postgres://{}@127.0.0.1:{port},localhost:{port}/{}",
        target.role,
        target.db.name,
        port = target.port
    );
    let (code, _, stderr) = run(
        &["status"],
        &[
            ("DATABASE_URL", &two_hosts),
            ("PGPASSFILE", &per_host.display().to_string()),
        ],
    );
    assert_eq!(code, Some(0), "each host with its own password: {stderr}");
    assert!(!stderr.contains("wrong-for-this-host"), "{stderr}");
    for (what, env, expected) in cases {
        let (code, _, stderr) = run(&["status"], env);
        match expected {
            Some(source) => {
                assert_eq!(code, Some(0), "{what}: {stderr}");
                assert!(
                    stderr.contains(&format!("password={source}")),
                    "{what}: {stderr}"
                );
            }
            None => {
                assert_eq!(code, Some(1), "{what}: {stderr}");
                assert!(
                    stderr.contains("password authentication failed"),
                    "{what}: {stderr}"
                );
            }
        }
        for secret in [
            "wrong-in-env",
            "wrong-in-url",
            "wrong-in-file",
            target.password,
        ] {
            assert!(!stderr.contains(secret), "{what}: {stderr}");
        }
    }
}

/// PGHOST, PGPORT, PGUSER and PGDATABASE fill in a URL that gives none of
/// them; a URL's own parts win; PGAPPNAME names the sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_variables_fill_in_what_the_url_leaves_out() {
    let target = Target::new().await;
    let port = target.port.to_string();
    let env = [
        ("PGHOST", target.host.as_str()),
        ("PGPORT", port.as_str()),
        ("PGUSER", target.role.as_str()),
        ("PGDATABASE", target.db.name.as_str()),
        ("PGPASSWORD", target.password),
    ];
    let mut all = vec![("DATABASE_URL", "postgres://")];
    all.extend(env);
    // libpq's variables this worker does not read change nothing (libpq
    // would connect to 127.0.0.9 and look for a service file).
    all.extend([
        ("PGHOSTADDR", "127.0.0.9"),
        ("PGSERVICE", "no-such-service"),
    ]);
    let (code, _, stderr) = run(&["status"], &all);
    assert_eq!(code, Some(0), "{stderr}");
    // The URL's database wins over PGDATABASE.
    let mut other = vec![("DATABASE_URL", "postgres:///no_such_database_33")];
    other.extend(env);
    let (code, _, stderr) = run(&["status"], &other);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no_such_database_33"), "{stderr}");
    // No user in the URL nor PGUSER: the operating system's user name, as
    // libpq (not this role: refused).
    let no_user = format!(
        "postgres://{}:{}/{}",
        target.host, target.port, target.db.name
    );
    let (code, _, stderr) = run(
        &["status"],
        &[("DATABASE_URL", &no_user), ("PGPASSWORD", target.password)],
    );
    assert_eq!(code, Some(1), "{stderr}");
    let os_user = whoami_user();
    assert!(
        stderr.contains(&format!(
            "password authentication failed for user \"{os_user}\""
        )),
        "{stderr}"
    );

    // PGAPPNAME: the sessions of `run` carry it.
    let addr = format!("127.0.0.1:{}", free_port());
    let mut command = binary();
    command
        .arg("run")
        .env("DATABASE_URL", target.url_with(target.password))
        .env("PGAPPNAME", "be-libpq-appname")
        .env("NO_PUBLISHER", "true")
        .env("METRICS_ADDR", &addr);
    let mut running = Running::spawn(command);
    wait_until(
        "a session named by PGAPPNAME",
        Duration::from_secs(30),
        || async {
            target
                .db
                .count(&format!(
                    "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = '{}' \
                 AND application_name = 'be-libpq-appname'",
                    target.db.name
                ))
                .await
                > 0
        },
    )
    .await;
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
    let stderr = running.stderr();
    assert!(stderr.contains("password=url"), "{stderr}");
}

/// A malformed variable is one exit-2 line naming it, before anything
/// connects, and never quotes PGPASSWORD.
#[test]
fn bad_values_exit_2_naming_the_variable() {
    for (variable, value, expected) in [
        ("PGPORT", "54x32", "PGPORT: \"54x32\" is not a port"),
        (
            "PGCONNECT_TIMEOUT",
            "5s",
            "PGCONNECT_TIMEOUT: \"5s\" is not a whole number",
        ),
        (
            "PGSSLMODE",
            "verify",
            "PGSSLMODE: sslmode \"verify\" is not one of",
        ),
        (
            "PGSSLCERT",
            "/etc/c.pem",
            "PGSSLCERT: sslcert is given without sslkey",
        ),
        (
            "PGSSLKEY",
            "/etc/k.pem",
            "PGSSLKEY: sslkey is given without sslcert",
        ),
        ("PGHOST", "a,,b", "PGHOST: has no host"),
    ] {
        for command in ["status", "run"] {
            let (code, _, stderr) = run(
                &[command],
                &[
                    ("DATABASE_URL", "postgres:///db"),
                    (variable, value),
                    ("PGPASSWORD", "s3cret-Pg-33"),
                    ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9"),
                ],
            );
            assert_eq!(code, Some(2), "{variable}={value} {command}: {stderr}");
            assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
            assert!(stderr.contains(expected), "{expected:?} in: {stderr}");
            assert!(!stderr.contains("s3cret-Pg-33"), "{stderr}");
        }
    }
    // An empty variable counts as unset: no exit 2, the connection is
    // tried (and refused: nothing listens on port 9).
    let mut empty: Vec<(&str, &str)> = LIBPQ_VARIABLES.iter().map(|v| (*v, "")).collect();
    empty.push(("DATABASE_URL", "postgres://u:pw@127.0.0.1:9/db"));
    let (code, _, stderr) = run(&["status"], &empty);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("Connection refused"), "{stderr}");
}

/// A PostgreSQL listening on a Unix socket only, in a scratch folder.
struct SocketServer {
    pg: Postgres,
    port: u16,
}

impl SocketServer {
    async fn start() -> Self {
        let dir = tempdir("pgsock");
        let port = free_port();
        let pg = Postgres::start(&dir, port, &["-c", "listen_addresses=''"])
            .expect("start a socket-only PostgreSQL");
        Self { pg, port }
    }

    fn dir(&self) -> String {
        self.pg.dir().display().to_string()
    }

    /// The superuser over the socket (local connections are trusted).
    async fn admin(&self, sql: &str) {
        let url = format!(
            "postgres:///postgres?host={}&port={}&user=postgres",
            self.dir(),
            self.port
        );
        testkit::postgres::exec(&url, sql)
            .await
            .expect("admin statement over the socket");
    }
}

/// The socket-only server is reachable in each of libpq's socket forms:
/// `?host=/dir`, a percent-encoded socket path, and no host at all with
/// PGHOST (the default directory's stand-in: the default itself,
/// /var/run/postgresql, is the machine's, not the test's). TCP is refused.
/// sslmode does not apply to a socket, as in libpq. A password from the
/// file is found for the socket by its directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_only_postgres_is_reachable_in_every_url_form() {
    let server = SocketServer::start().await;
    server.admin("CREATE DATABASE crm").await;
    let (dir, port) = (server.dir(), server.port.to_string());
    let encoded = percent_encode(&dir);
    let forms: [(&str, String, Vars<'_>); 5] = [
        (
            "?host=/dir",
            format!("postgres://postgres@/crm?host={dir}&port={port}"),
            &[],
        ),
        (
            "a percent-encoded socket path",
            format!("postgres://postgres@{encoded}:{port}/crm"),
            &[],
        ),
        (
            "postgres:///crm with PGHOST",
            "postgres:///crm".to_owned(),
            &[("PGHOST", &dir), ("PGPORT", &port), ("PGUSER", "postgres")],
        ),
        (
            "postgresql://user@/crm with PGHOST",
            "postgresql://postgres@/crm".to_owned(),
            &[("PGHOST", &dir), ("PGPORT", &port)],
        ),
        (
            "sslmode=verify-full does not apply to a socket",
            format!("postgres://postgres@/crm?host={dir}&port={port}&sslmode=require"),
            &[("PGSSLMODE", "verify-full")],
        ),
    ];
    let (code, _, stderr) = run(&["migrate"], &[("DATABASE_URL", &forms[0].1)]);
    assert_eq!(code, Some(0), "migrate: {stderr}");
    for (what, url, extra) in &forms {
        let mut env = vec![("DATABASE_URL", url.as_str())];
        env.extend(extra.iter().copied());
        let (code, stdout, stderr) = run(&["seed", "--active", "3", "--due-fraction", "1"], &env);
        assert_eq!(code, Some(0), "{what}: {stderr}");
        assert_eq!(stdout.trim(), r#"{"inserted":3}"#, "{what}");
        let (code, stdout, stderr) = run(&["once"], &env);
        assert_eq!(code, Some(0), "{what}: {stderr}");
        assert!(
            stdout.contains("\"reserve_expired_count\""),
            "{what}: {stdout}"
        );
    }
    // No TCP listener: the same server over 127.0.0.1 is refused.
    let (code, _, stderr) = run(
        &["status"],
        &[(
            "DATABASE_URL",
            &format!("postgres://postgres@127.0.0.1:{port}/crm"),
        )],
    );
    assert_eq!(code, Some(1), "TCP must be refused: {stderr}");
    // A directory where nothing listens: the socket file is named.
    let (code, _, stderr) = run(
        &["status"],
        &[(
            "DATABASE_URL",
            &format!("postgres://postgres@/crm?host={dir}&port=1"),
        )],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("(Unix socket {dir}/.s.PGSQL.1)")),
        "{stderr}"
    );

    // A role that must give a password over the socket, found in the file
    // by the socket directory (not the default one: not `localhost`).
    server
        .admin("CREATE ROLE sockuser LOGIN SUPERUSER PASSWORD 'sock-pw-33'")
        .await;
    let hba = server.pg.dir().join("data/pg_hba.conf");
    let original = std::fs::read_to_string(&hba).expect("pg_hba.conf");
    std::fs::write(
        &hba,
        format!("local all sockuser scram-sha-256\n{original}"),
    )
    .expect("write pg_hba.conf");
    server.admin("SELECT pg_reload_conf()").await;
    let files = tempdir("pgpass-sock");
    let by_dir = pgpass(
        &files,
        "by-dir",
        &[
            "localhost:*:*:sockuser:not-for-this-directory".to_owned(),
            format!("{}:{port}:crm:sockuser:sock-pw-33", field(&dir)),
        ],
        0o600,
    );
    let url = format!("postgres://sockuser@/crm?host={dir}&port={port}");
    wait_until("pg_hba.conf reloaded", Duration::from_secs(10), || async {
        run(&["status"], &[("DATABASE_URL", &url)]).0 == Some(1)
    })
    .await;
    let (code, _, stderr) = run(
        &["status"],
        &[
            ("DATABASE_URL", &url),
            ("PGPASSFILE", &by_dir.display().to_string()),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("password=passfile {}", by_dir.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("sock-pw-33"), "{stderr}");
}
