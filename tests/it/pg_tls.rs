//! PostgreSQL over TLS, against real TLS-only servers this module starts
//! (`scripts/pg-tls-certs.sh` makes the CA and certificates with openssl;
//! the servers' pg_hba.conf refuses plaintext over TCP): the expiry round
//! trip over `verify-full`, the bad cases each as one clear line naming
//! `DATABASE_URL` within the connect timeout, a rotated client certificate
//! used without a restart, `/readyz` while TLS fails, and libpq's `PGSSL*`
//! variables in place of the URL's parameters.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use booking_expiration::{config::DatabaseSettings, db, libpq::DatabaseUrl};
use diesel::{QueryableByName, sql_types::Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use testkit::{postgres::Postgres, run_script};

use crate::support::*;

/// The role that must present a client certificate (pg_hba.conf line
/// `clientcert=verify-full`; the certificate's CN is its name).
const CLIENT_USER: &str = "tlsuser";
const CLIENT_PASSWORD: &str = "tls-user-pw-Zq81";

/// A TLS-only PostgreSQL of its own, stopped on drop.
struct TlsServer {
    pg: Postgres,
    port: u16,
    password: String,
}

impl TlsServer {
    /// Starts a server presenting `DIR/tls/{cert}.crt` (see
    /// scripts/pg-tls-certs.sh), with the role [`CLIENT_USER`].
    async fn start(cert: &str) -> Self {
        let dir = tempdir("pg-tls");
        let common = run_script(
            "pg-tls-certs.sh",
            &[dir.to_str().expect("UTF-8 path"), CLIENT_USER],
        )
        .expect("make the certificates");
        let tls = dir.join("tls");
        let cert_option = format!(
            "ssl_cert_file={}",
            tls.join(format!("{cert}.crt")).display()
        );
        let key_option = format!("ssl_key_file={}", tls.join(format!("{cert}.key")).display());
        let mut options: Vec<&str> = common.split_whitespace().collect();
        options.extend(["-c", &cert_option, "-c", &key_option]);
        let port = free_port();
        let pg = Postgres::start(&dir, port, &options).expect("start a TLS PostgreSQL");
        let password = url::Url::parse(&pg.admin_url)
            .unwrap()
            .password()
            .unwrap()
            .to_owned();
        let server = Self { pg, port, password };
        server
            .admin(&format!(
                "CREATE ROLE {CLIENT_USER} LOGIN PASSWORD '{CLIENT_PASSWORD}'"
            ))
            .await;
        server
    }

    /// A file the certificate script wrote.
    fn file(&self, name: &str) -> PathBuf {
        self.pg.dir().join("tls").join(name)
    }

    /// The superuser over the Unix socket (TCP refuses plaintext).
    fn socket_url(&self, database: &str) -> String {
        format!(
            "postgres:///{database}?host={}&port={}&user=postgres",
            self.pg.dir().display(),
            self.port
        )
    }

    async fn admin(&self, sql: &str) {
        testkit::postgres::exec(&self.socket_url("postgres"), sql)
            .await
            .expect("admin statement over the socket");
    }

    async fn count(&self, database: &str, sql: &str) -> i64 {
        let mut conn = AsyncPgConnection::establish(&self.socket_url(database))
            .await
            .expect("connect over the socket");
        testkit::postgres::count(&mut conn, sql).await.unwrap()
    }

    /// `postgres://postgres:PASSWORD@HOST:PORT/DATABASE?QUERY`.
    fn url(&self, host: &str, database: &str, query: &str) -> String {
        format!(
            "postgres://postgres:{}@{host}:{}/{database}?{query}",
            self.password, self.port
        )
    }

    /// As [`CLIENT_USER`].
    fn client_url(&self, query: &str) -> String {
        format!(
            "postgres://{CLIENT_USER}:{CLIENT_PASSWORD}@localhost:{}/postgres?{query}",
            self.port
        )
    }

    /// `sslmode=verify-full` with the test CA.
    fn verify_full(&self) -> String {
        format!(
            "sslmode=verify-full&sslrootcert={}",
            self.file("ca.crt").display()
        )
    }
}

/// Runs `binary ARGS` with `DATABASE_URL`, logs off (so stderr is only the
/// error line), and a short connect timeout.
fn run_binary(url: &str, args: &[&str]) -> (Option<i32>, String, String, Duration) {
    let started = Instant::now();
    let output = binary()
        .args(args)
        .env("DATABASE_URL", url)
        .env("DATABASE_CONNECT_TIMEOUT", "3s")
        .env("RUST_LOG", "off")
        .output()
        .expect("run the binary");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        started.elapsed(),
    )
}

/// A failed connection: exit 1, one line on stderr that names
/// `DATABASE_URL` and says `expected`, within the connect timeout, with
/// no password and no key material.
fn assert_fails_clearly(url: &str, secrets: &[&str], expected: &str) {
    let (code, _, stderr, elapsed) = run_binary(url, &["status"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("DATABASE_URL"), "{stderr}");
    assert!(
        stderr.contains(expected),
        "expected {expected:?} in: {stderr}"
    );
    assert!(elapsed < Duration::from_secs(3 + 2), "took {elapsed:?}");
    for secret in secrets {
        assert!(!stderr.contains(secret), "a secret in: {stderr}");
    }
    assert!(!stderr.contains("PRIVATE KEY"), "{stderr}");
    eprintln!("as expected ({elapsed:?}): {}", stderr.trim_end());
}

/// The full round trip of an operator over `verify-full` (host name
/// `localhost`, SCRAM with channel binding required): migrate, seed, one
/// expiry cycle, status — the server accepts no plaintext over TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_expires_over_verify_full() {
    let server = TlsServer::start("server").await;
    server.admin("CREATE DATABASE app").await;
    let url = server.url(
        "localhost",
        "app",
        &format!("{}&channel_binding=require", server.verify_full()),
    );
    let (code, _, stderr, _) = run_binary(&url, &["migrate"]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, stderr, _) =
        run_binary(&url, &["seed", "--active", "30", "--due-fraction", "1"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim(), r#"{"inserted":30}"#);
    let (code, stdout, stderr, _) = run_binary(&url, &["once"]);
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("JSON line");
    let expired = report["reserve_expired_count"].as_i64().unwrap()
        + report["booking_expired_count"].as_i64().unwrap();
    assert_eq!(expired, 30, "{report}");
    assert_eq!(
        server
            .count(
                "app",
                "SELECT count(*) AS n FROM bookings WHERE version = 2"
            )
            .await,
        30
    );
    assert_eq!(
        server
            .count("app", "SELECT count(*) AS n FROM booking_expiration_outbox")
            .await,
        30
    );
    let (code, stdout, stderr, _) = run_binary(&url, &["status", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("\"outbox_unpublished\":30"), "{stdout}");
}

#[derive(QueryableByName)]
struct Ssl {
    #[diesel(sql_type = Text)]
    dn: String,
}

/// The client certificate's subject as the server saw it on `conn`.
async fn client_dn(conn: &mut AsyncPgConnection) -> String {
    let row: Ssl = diesel::sql_query(
        "SELECT coalesce(client_dn, '') AS dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    .get_result(conn)
    .await
    .expect("pg_stat_ssl");
    row.dn
}

fn copy(from: &Path, to: &Path) {
    // Written aside and renamed, as cert-manager's atomic writer does.
    let aside = to.with_extension("new");
    std::fs::copy(from, &aside).expect("copy");
    std::fs::rename(&aside, to).expect("rename");
}

/// Rotation: the certificate and key files are read again for every new
/// connection of the pool, so replacing them takes effect without a
/// restart — a certificate the server refuses fails the next connection,
/// and a new valid one is the one the server sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_client_certificate_is_used_by_the_next_connection() {
    let server = TlsServer::start("server").await;
    let mounted = tempdir("pg-tls-client");
    let (cert, key) = (mounted.join("tls.crt"), mounted.join("tls.key"));
    copy(&server.file("client.crt"), &cert);
    copy(&server.file("client.key"), &key);
    let url = server.client_url(&format!(
        "{}&sslcert={}&sslkey={}",
        server.verify_full(),
        cert.display(),
        key.display()
    ));
    let settings = DatabaseSettings {
        pool_size: 2,
        connect_timeout: Duration::from_secs(5),
        statement_timeout: Duration::from_secs(30),
        ..DatabaseSettings::new(DatabaseUrl::parse(&url).expect("valid URL and files"))
    };
    let pool = db::build_pool(&settings);

    let mut first = pool.dedicated_connection().await.expect("first connection");
    assert_eq!(client_dn(&mut first).await, format!("/CN={CLIENT_USER}"));

    // A certificate from a CA the server does not trust.
    copy(&server.file("other-ca.crt"), &cert);
    copy(&server.file("other-ca.key"), &key);
    let refused = pool
        .dedicated_connection()
        .await
        .err()
        .expect("the replaced certificate is refused");
    assert!(
        refused
            .to_string()
            .contains("the server refused the client certificate"),
        "{refused}"
    );

    // The renewed certificate (same user, new key).
    copy(&server.file("client2.crt"), &cert);
    copy(&server.file("client2.key"), &key);
    let mut renewed = pool
        .dedicated_connection()
        .await
        .expect("renewed certificate");
    let dn = client_dn(&mut renewed).await;
    assert_eq!(dn, format!("/CN={CLIENT_USER}/O=rotated"));
    // The connection made before the rotation is still fine.
    assert_eq!(client_dn(&mut first).await, format!("/CN={CLIENT_USER}"));
}

/// Each bad case: one clear line naming DATABASE_URL, within the connect
/// timeout, no password, no key. And `/readyz` says 503 while the server's
/// certificate cannot be verified, then 200 once the CA file is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cases_fail_clearly_and_readyz_follows() {
    let server = TlsServer::start("server").await;
    let secrets = [server.password.as_str(), CLIENT_PASSWORD];
    let ca = server.file("ca.crt").display().to_string();
    let other_ca = server.file("other-ca.crt").display().to_string();

    // Wrong CA.
    assert_fails_clearly(
        &server.url(
            "127.0.0.1",
            "postgres",
            &format!("sslmode=verify-full&sslrootcert={other_ca}"),
        ),
        &secrets,
        &format!("the server's certificate is not signed by a CA in sslrootcert {other_ca}"),
    );
    // No sslrootcert: the bundled public roots do not know the test CA.
    assert_fails_clearly(
        &server.url("127.0.0.1", "postgres", "sslmode=verify-full"),
        &secrets,
        "not signed by a CA in the bundled webpki roots",
    );
    // Missing client certificate where the server requires one.
    assert_fails_clearly(
        &server.client_url(&server.verify_full()),
        &secrets,
        "requires a valid client certificate",
    );
    // Wrong password.
    let mut wrong =
        url::Url::parse(&server.url("localhost", "postgres", &server.verify_full())).unwrap();
    wrong.set_password(Some("not-the-password-41")).unwrap();
    assert_fails_clearly(
        wrong.as_str(),
        &["not-the-password-41", &server.password],
        "password authentication failed",
    );
    // A plaintext client against the TLS-only server.
    assert_fails_clearly(
        &server.url("127.0.0.1", "postgres", "sslmode=disable"),
        &secrets,
        "no encryption",
    );
    // The good settings work, also without any certificate check (require)
    // and with libpq's default (prefer, which finds TLS offered).
    for query in [
        server.verify_full(),
        "sslmode=require".to_owned(),
        String::new(),
    ] {
        let (code, _, stderr, _) =
            run_binary(&server.url("127.0.0.1", "postgres", &query), &["migrate"]);
        assert_eq!(code, Some(0), "{query}: {stderr}");
    }

    // /readyz: the CA file first holds the wrong CA, then is fixed in place.
    let mounted = tempdir("pg-tls-ca");
    let root = mounted.join("ca.crt");
    copy(Path::new(&other_ca), &root);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut command = binary();
    command
        .arg("run")
        .env(
            "DATABASE_URL",
            server.url(
                "127.0.0.1",
                "postgres",
                &format!("sslmode=verify-full&sslrootcert={}", root.display()),
            ),
        )
        .env("NO_PUBLISHER", "true")
        .env("DATABASE_CONNECT_TIMEOUT", "2s")
        .env("METRICS_ADDR", &addr)
        .env("RUST_LOG", "warn");
    let mut running = Running::spawn(command);
    wait_http_status(&addr, "/readyz", 503, Duration::from_secs(15)).await;
    let (_, body) = http_get(&addr, "/readyz").await.expect("readyz");
    assert!(body.contains("database: unreachable"), "{body}");
    copy(Path::new(&ca), &root);
    wait_http_status(&addr, "/readyz", 200, Duration::from_secs(30)).await;
    running.terminate();
    assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
    let stderr = running.stderr();
    assert!(
        stderr.contains("not signed by a CA in sslrootcert"),
        "{stderr}"
    );
    for secret in secrets {
        assert!(!stderr.contains(secret), "{stderr}");
    }
}

/// A server certificate for another name fails `verify-full` (connecting by
/// 127.0.0.1) but passes `verify-ca`; an expired one fails both, and
/// `require` (no check, as libpq) still connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_host_name_and_expired_server_certificates() {
    let (wrong_name, expired) =
        tokio::join!(TlsServer::start("wrong-name"), TlsServer::start("expired"));
    let ca = |server: &TlsServer| server.file("ca.crt").display().to_string();
    assert_fails_clearly(
        &wrong_name.url("127.0.0.1", "postgres", &wrong_name.verify_full()),
        &[&wrong_name.password],
        "the server's certificate is not valid for the host name in DATABASE_URL",
    );
    let verify_ca = format!("sslmode=verify-ca&sslrootcert={}", ca(&wrong_name));
    let (code, _, stderr, _) = run_binary(
        &wrong_name.url("127.0.0.1", "postgres", &verify_ca),
        &["migrate"],
    );
    assert_eq!(code, Some(0), "verify-ca ignores the name: {stderr}");

    for query in [
        expired.verify_full(),
        format!("sslmode=verify-ca&sslrootcert={}", ca(&expired)),
        // libpq: require with a root file checks the chain as verify-ca.
        format!("sslmode=require&sslrootcert={}", ca(&expired)),
    ] {
        assert_fails_clearly(
            &expired.url("localhost", "postgres", &query),
            &[&expired.password],
            "the server's certificate has expired",
        );
    }
    let (code, _, stderr, _) = run_binary(
        &expired.url("localhost", "postgres", "sslmode=require"),
        &["migrate"],
    );
    assert_eq!(code, Some(0), "require checks no certificate: {stderr}");
}

/// An unreadable or malformed file named by sslrootcert, sslcert or sslkey
/// is a configuration error at start: exit 2, one line naming
/// DATABASE_URL, the setting and the path, never the file's content.
#[test]
fn bad_certificate_files_exit_2_at_start() {
    let dir = tempdir("pg-tls-bad");
    let marker = "c2VjcmV0LWtleS1tYXRlcmlhbA";
    // 0600: a key file others may read is refused before it is read
    // (libpq's rule; the case is below).
    let write = |name: &str, text: &str| {
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path.display().to_string()
    };
    let garbage = write(
        "garbage.pem",
        &format!("-----BEGIN CERTIFICATE-----\n{marker}!!!\n-----END CERTIFICATE-----\n"),
    );
    let unterminated = write(
        "unterminated.pem",
        &format!("-----BEGIN PRIVATE KEY-----\n{marker}\n"),
    );
    let empty = write("empty.pem", "");
    let not_pem = write("notes.txt", &format!("{marker}\n"));
    let missing = dir.join("missing.pem").display().to_string();
    let a_dir = dir.display().to_string();
    // A real pair, to isolate one bad file at a time.
    let certs = tempdir("pg-tls-good");
    run_script("pg-tls-certs.sh", &[certs.to_str().unwrap(), CLIENT_USER])
        .expect("make the certificates");
    let good_cert = certs.join("tls/client.crt").display().to_string();
    let good_key = certs.join("tls/client.key").display().to_string();
    let other_key = certs.join("tls/client2.key").display().to_string();
    let cert_as_key = write(
        "cert-as-key.pem",
        &std::fs::read_to_string(&good_cert).unwrap(),
    );
    let open_key = dir.join("open.key");
    std::fs::copy(&good_key, &open_key).unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let open_key = open_key.display().to_string();

    let cases = [
        (
            format!("sslrootcert={garbage}"),
            format!("sslrootcert {garbage}: malformed PEM"),
        ),
        (
            format!("sslrootcert={empty}"),
            format!("sslrootcert {empty}: no certificate in the file"),
        ),
        (
            format!("sslrootcert={not_pem}"),
            format!("sslrootcert {not_pem}: no certificate in the file"),
        ),
        (
            format!("sslrootcert={missing}"),
            format!("sslrootcert {missing}: cannot read"),
        ),
        (
            format!("sslrootcert={a_dir}"),
            format!("sslrootcert {a_dir}: cannot read"),
        ),
        (
            format!("sslcert={garbage}&sslkey={good_key}"),
            format!("sslcert {garbage}: malformed PEM"),
        ),
        (
            format!("sslcert={good_cert}&sslkey={unterminated}"),
            format!("sslkey {unterminated}: malformed PEM"),
        ),
        (
            format!("sslcert={good_cert}&sslkey={cert_as_key}"),
            format!("sslkey {cert_as_key}: no unencrypted private key"),
        ),
        (
            format!("sslcert={good_cert}&sslkey={open_key}"),
            format!("sslkey {open_key}: has group or world access (mode 0644)"),
        ),
        (
            format!("sslcert={good_cert}&sslkey={other_key}"),
            format!("sslkey {other_key}: cannot be used with sslcert"),
        ),
        (
            format!("sslcert={good_cert}"),
            "sslcert is given without sslkey".to_owned(),
        ),
        (
            "sslmode=verify".to_owned(),
            "sslmode \"verify\" is not one of".to_owned(),
        ),
        (
            "sslmode=require&sslrootcert=system".to_owned(),
            "sslmode=require may not be used with sslrootcert=system".to_owned(),
        ),
    ];
    for (query, expected) in cases {
        let url = format!("postgres://u:pw-s3cret-9@127.0.0.1:9/db?sslmode=verify-full&{query}");
        let (code, _, stderr, _) = run_binary(&url, &["once"]);
        assert_eq!(code, Some(2), "{query}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&format!("DATABASE_URL: {expected}")),
            "expected {expected:?} in: {stderr}"
        );
        assert!(!stderr.contains("pw-s3cret-9"), "{stderr}");
        assert!(!stderr.contains(marker), "file content in: {stderr}");
    }
}

/// Several hosts under `verify-full`: each host's certificate is checked
/// against that host's own name, and a host that fails the check is left
/// for the next one, as libpq does. `hostaddr` sends both names to this
/// one server, whose certificate names `localhost` and 127.0.0.1 only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_hosts_each_checked_against_its_own_name() {
    let server = TlsServer::start("server").await;
    let both = |hosts: &str| {
        format!(
            "postgres://postgres:{}@{hosts}/postgres?hostaddr=127.0.0.1,127.0.0.1&{}",
            server.password,
            server.verify_full()
        )
    };
    let port = server.port;
    // The first name is not on the certificate: the second host is used.
    let (code, _, stderr, _) = run_binary(
        &both(&format!("db.example.invalid:{port},localhost:{port}")),
        &["migrate"],
    );
    assert_eq!(code, Some(0), "{stderr}");
    // Neither name is: the last host's reason, one line, no password.
    assert_fails_clearly(
        &both(&format!(
            "db.example.invalid:{port},other.example.invalid:{port}"
        )),
        &[&server.password],
        "the server's certificate is not valid for the host name in DATABASE_URL",
    );
}

/// libpq refuses `verify-ca` without a root certificate file, and with
/// `sslrootcert=system`: both refuse to start (exit 2), one line naming
/// sslrootcert, before any connection. Before issue 25, `verify-ca` without
/// a file checked the chain against the bundled public roots without the
/// host name: any publicly trusted certificate for any name passed.
#[test]
fn verify_ca_without_a_root_file_refuses_to_start() {
    for (query, expected) in [
        (
            "sslmode=verify-ca",
            "DATABASE_URL: sslmode=verify-ca needs sslrootcert=FILE",
        ),
        (
            "sslmode=verify-ca&sslrootcert=",
            "DATABASE_URL: sslmode=verify-ca needs sslrootcert=FILE",
        ),
        (
            "sslmode=verify-ca&sslrootcert=system",
            "DATABASE_URL: sslmode=verify-ca may not be used with sslrootcert=system",
        ),
    ] {
        let url = format!("postgres://u:pw-s3cret-9@127.0.0.1:9/db?{query}");
        for command in ["once", "status", "migrate"] {
            let (code, _, stderr, _) = run_binary(&url, &[command]);
            assert_eq!(code, Some(2), "{query}: {stderr}");
            assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
            assert!(stderr.contains(expected), "{expected:?} in: {stderr}");
            assert!(!stderr.contains("pw-s3cret-9"), "{stderr}");
        }
    }
}

/// A certificate from a CA in the public root set, issued for another
/// host: what an attacker who bought a certificate for their own name
/// shows. The test's CA stands for the public CA, added to the bundled
/// roots where production trusts them ([`db::tls::client_config_trusting`]);
/// the server shows `wrong-name.crt` (that CA's, for db.example.invalid).
/// verify-full refuses it for 127.0.0.1 and localhost (and takes it for the
/// name it was issued to: the CA is trusted); verify-ca never gets that far
/// (no root file: refused at start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_cas_certificate_for_another_host_is_refused() {
    use booking_expiration::tls::bundled_roots;
    use rustls_pki_types::{CertificateDer, pem::PemObject};
    use tokio_postgres_rustls::MakeRustlsConnect;

    let server = TlsServer::start("wrong-name").await;
    let public_ca = CertificateDer::from_pem_file(server.file("ca.crt")).expect("the CA");
    let public_roots = || {
        let mut roots = bundled_roots();
        roots.add(public_ca.clone()).expect("a CA certificate");
        roots
    };
    let connect = async |url: &str| {
        let url = DatabaseUrl::parse(url).expect("a valid URL");
        let tls = db::tls::client_config_trusting(url.tls(), public_roots).expect("TLS config");
        let mut config = url.config().clone();
        config.ssl_mode(tokio_postgres::config::SslMode::Require);
        config
            .connect(MakeRustlsConnect::new(tls))
            .await
            .map(drop)
            .map_err(|e| format!("{e:?}"))
    };
    for host in ["127.0.0.1", "localhost"] {
        let error = connect(&server.url(host, "postgres", "sslmode=verify-full"))
            .await
            .expect_err("a certificate for another name");
        assert!(error.contains("NotValidForName"), "{host}: {error}");
    }
    // The same certificate, asked for by its own name, passes: the refusal
    // above is the name, not an unknown CA.
    let own_name = format!(
        "postgres://postgres:{}@db.example.invalid:{}/postgres?hostaddr=127.0.0.1&sslmode=verify-full",
        server.password, server.port
    );
    connect(&own_name).await.expect("its own name");
    let error = DatabaseUrl::parse(&server.url("127.0.0.1", "postgres", "sslmode=verify-ca"))
        .expect_err("verify-ca without a root file");
    assert!(error.problem.contains("needs sslrootcert=FILE"), "{error}");
}

/// libpq reads `~/.postgresql/root.crt`, `postgresql.crt` and
/// `postgresql.key` when the parameters are not given; this worker never
/// does. With the test CA and a valid client certificate there, verify-full
/// without sslrootcert still trusts only the bundled roots, and the role
/// that must show a client certificate shows none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_read_from_the_home_directory() {
    let server = TlsServer::start("server").await;
    let home = tempdir("pg-tls-home");
    let dot = home.join(".postgresql");
    std::fs::create_dir_all(&dot).unwrap();
    for (from, to) in [
        ("ca.crt", "root.crt"),
        ("client.crt", "postgresql.crt"),
        ("client.key", "postgresql.key"),
    ] {
        copy(&server.file(from), &dot.join(to));
    }
    let with_home = |url: &str| {
        binary()
            .arg("status")
            .env("DATABASE_URL", url)
            .env("HOME", &home)
            .env("DATABASE_CONNECT_TIMEOUT", "3s")
            .env("RUST_LOG", "off")
            .output()
            .expect("run the binary")
    };
    for (url, expected) in [
        (
            server.url("localhost", "postgres", "sslmode=verify-full"),
            "not signed by a CA in the bundled webpki roots",
        ),
        (
            server.client_url(&server.verify_full()),
            "requires a valid client certificate",
        ),
    ] {
        let output = with_home(&url);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(expected), "{expected:?} in: {stderr}");
    }
}

/// libpq's `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY` reach
/// the TLS configuration where the URL does not give the parameter: with a
/// URL that names none, the variables alone make a `verify-full`
/// connection with a client certificate; a wrong CA from the variable
/// fails as the parameter would, named by its path; the URL's own
/// `sslmode` wins; a key file others may read, named by `PGSSLKEY`, exits
/// 2 naming the variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgssl_variables_reach_the_tls_configuration() {
    let server = TlsServer::start("server").await;
    // This server is the test's own: its client role may run migrate.
    server
        .admin(&format!("ALTER ROLE {CLIENT_USER} SUPERUSER"))
        .await;
    let file = |name: &str| server.file(name).display().to_string();
    let (ca, other_ca) = (file("ca.crt"), file("other-ca.crt"));
    let (cert, key) = (file("client.crt"), file("client.key"));
    let run_with = |url: &str, env: &[(&str, &str)]| {
        let output = binary()
            .arg("status")
            .env("DATABASE_URL", url)
            .env("DATABASE_CONNECT_TIMEOUT", "3s")
            .env("RUST_LOG", "off")
            .envs(env.iter().copied())
            .output()
            .expect("run the binary");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let migrate = |url: &str, env: &[(&str, &str)]| {
        binary()
            .arg("migrate")
            .env("DATABASE_URL", url)
            .env("RUST_LOG", "off")
            .envs(env.iter().copied())
            .output()
            .expect("run the binary")
    };
    let verify_full = [("PGSSLMODE", "verify-full"), ("PGSSLROOTCERT", ca.as_str())];

    // The superuser over verify-full from the variables alone.
    let plain_url = server.url("localhost", "postgres", "");
    let output = migrate(&plain_url, &verify_full);
    assert!(output.status.success(), "{output:?}");
    // The role that must show a client certificate: PGSSLCERT/PGSSLKEY.
    let client_url = server.client_url("");
    let (code, stderr) = run_with(&client_url, &verify_full);
    assert_eq!(code, Some(1), "no client certificate yet: {stderr}");
    assert!(
        stderr.contains("requires a valid client certificate"),
        "{stderr}"
    );
    let with_cert = [
        verify_full[0],
        verify_full[1],
        ("PGSSLCERT", cert.as_str()),
        ("PGSSLKEY", key.as_str()),
    ];
    let output = migrate(&client_url, &with_cert);
    assert!(output.status.success(), "{output:?}");
    // A wrong CA from PGSSLROOTCERT.
    let (code, stderr) = run_with(
        &plain_url,
        &[("PGSSLMODE", "verify-full"), ("PGSSLROOTCERT", &other_ca)],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("not signed by a CA in sslrootcert {other_ca}")),
        "{stderr}"
    );
    // The URL's sslmode wins: disable reaches the TLS-only server in
    // plaintext, which it refuses.
    let (code, stderr) = run_with(
        &server.url("localhost", "postgres", "sslmode=disable"),
        &verify_full,
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no encryption"), "{stderr}");

    // A key file group or others may read, named by PGSSLKEY: exit 2.
    let open_dir = tempdir("pg-tls-open-key");
    let open_key = open_dir.join("open.key");
    std::fs::copy(&key, &open_key).unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let open_key = open_key.display().to_string();
    let (code, stderr) = run_with(
        &client_url,
        &[
            verify_full[0],
            verify_full[1],
            ("PGSSLCERT", cert.as_str()),
            ("PGSSLKEY", open_key.as_str()),
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "PGSSLKEY: sslkey {open_key}: has group or world access (mode 0644)"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains(CLIENT_PASSWORD), "{stderr}");
}
