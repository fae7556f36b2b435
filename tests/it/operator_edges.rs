//! Operator edges that were silent or slow (issue 40): a silent first
//! host, a stop signal during start-up, settings read outside the command
//! line, `sslmode=prefer` with a wrong password, an X.509 v1 client
//! certificate, a host from `PGHOST` in the start-up line, and a password
//! file the way a Kubernetes Secret mounts it. docs/reliability.md,
//! "Operator edges", lists each with what the worker does.

use std::{
    io::Write as _,
    net::TcpListener,
    os::unix::fs::PermissionsExt as _,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use testkit::{postgres::Postgres, run_script};

use crate::support::*;

/// A port that accepts TCP connections and never answers on them: a
/// frozen server (a stopped VM, a half-dead load balancer).
struct Silent {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl Silent {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a silent port");
        let port = listener.local_addr().expect("its address").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        // Holds every connection open, unanswered, until the test process
        // ends.
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming().map_while(Result::ok) {
                counter.fetch_add(1, Ordering::SeqCst);
                held.push(stream);
            }
        });
        Self { port, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// `url` with `host:port` replaced by `hosts` and `query` appended.
fn with_hosts(url: &str, hosts: &str, query: &str) -> String {
    let parsed = url::Url::parse(url).expect("a test URL");
    let authority = format!(
        "{}:{}",
        parsed.host_str().expect("a host"),
        parsed.port().expect("a port")
    );
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{}{separator}{query}", url.replacen(&authority, hosts, 1))
}

/// libpq's `connect_timeout` bounds each host's whole attempt (TCP, TLS,
/// start-up, authentication), then the next host is tried, as psql does.
/// A first host that accepts and never answers used to hold the
/// connection for all of `DATABASE_CONNECT_TIMEOUT` (30 s here) and fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_first_host_is_left_after_its_connect_timeout() {
    let db = TestDb::empty().await;
    let silent = Silent::start();
    let port = url::Url::parse(&db.url).unwrap().port().unwrap();
    let url = with_hosts(
        &db.url,
        &format!("127.0.0.1:{},127.0.0.1:{port}", silent.port),
        "connect_timeout=2",
    );
    let started = Instant::now();
    let output = binary()
        .args(["migrate", "--check"])
        .env("DATABASE_URL", &url)
        .env("DATABASE_CONNECT_TIMEOUT", "30s")
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = stderr_of(&output);
    assert_eq!(
        output.status.code(),
        Some(3),
        "pending migrations: {stderr}"
    );
    assert!(silent.accepted() >= 1, "the silent host was tried first");
    assert!(
        took < Duration::from_secs(8),
        "took {took:?}: connect_timeout=2 should leave the silent host after 2 s"
    );
}

/// SIGTERM while `run` waits on a database that accepts and never answers
/// (`DATABASE_CONNECT_TIMEOUT=60s`): it stops within a second, exit 0, and
/// says it stopped during start-up. It used to run on for the whole
/// connect timeout, past Kubernetes' grace period (a SIGKILL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_start_up_stops_within_a_second() {
    let silent = Silent::start();
    let mut command = binary();
    command
        .arg("run")
        .env(
            "DATABASE_URL",
            format!("postgres://u:hunter2@127.0.0.1:{}/crm", silent.port),
        )
        .env("DATABASE_CONNECT_TIMEOUT", "60s")
        .env(
            "KAFKA_BOOTSTRAP_SERVERS",
            format!("127.0.0.1:{}", free_port()),
        )
        .env("METRICS_ADDR", format!("127.0.0.1:{}", free_port()));
    let mut running = Running::spawn(command);
    wait_until("the start-up connects", Duration::from_secs(20), || {
        let tried = silent.accepted() >= 1;
        async move { tried }
    })
    .await;
    // Well into the connection attempt.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let signalled = Instant::now();
    running.terminate();
    let status = running.wait(Duration::from_secs(30)).await;
    let took = signalled.elapsed();
    let stderr = running.stderr();
    assert!(
        took < Duration::from_secs(1),
        "stopped {took:?} after SIGTERM: {stderr}"
    );
    assert_eq!(status.code(), Some(0), "a requested stop exits 0: {stderr}");
    assert!(
        stderr.contains("stopped during start-up"),
        "says so: {stderr}"
    );
}

/// Settings read outside the command line are checked like the others: a
/// `LOG_FORMAT` that is neither text nor json, a `RUST_LOG` that does not
/// parse, and an empty entry in `KAFKA_BOOTSTRAP_SERVERS` used to be
/// accepted silently (text logs, `info`, the entry skipped: the worker
/// started). Each is one line, exit 2, naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_log_format_rust_log_or_bootstrap_entry_exits_2_naming_it() {
    /// `run` with `setting=value` beside a database that is not there: the
    /// exit status and stderr, or a panic when it does not exit (it
    /// started, waiting for that database).
    async fn run_with(env: &[(&str, &str)]) -> (Option<i32>, String) {
        let mut command = binary();
        command
            .arg("run")
            .env("DATABASE_URL", "postgres://u:hunter2@127.0.0.1:1/crm")
            .env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
            .env("METRICS_ADDR", format!("127.0.0.1:{}", free_port()))
            .envs(env.iter().copied());
        let mut running = Running::spawn(command);
        let status = running.wait(Duration::from_secs(10)).await;
        (status.code(), running.stderr())
    }
    let cases = [
        ("LOG_FORMAT", "jsn"),
        ("RUST_LOG", "booking_expiration=["),
        ("KAFKA_BOOTSTRAP_SERVERS", "a:9092,,b:9092"),
        ("KAFKA_BOOTSTRAP_SERVERS", "a:9092,b:9092,"),
    ];
    for (setting, value) in cases {
        let (code, stderr) = run_with(&[(setting, value)]).await;
        assert_eq!(code, Some(2), "{setting}={value}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains(&format!("invalid configuration: {setting}: ")),
            "names {setting}: {stderr}"
        );
    }
    // Empty, and either case of the two formats, are taken: the rule
    // checked after logging is set up is what stops it.
    for value in ["", "text", "json", "JSON"] {
        let (code, stderr) = run_with(&[
            ("LOG_FORMAT", value),
            ("NO_WORKER", "true"),
            ("NO_PUBLISHER", "true"),
        ])
        .await;
        assert_eq!(code, Some(2), "{value:?}: {stderr}");
        assert!(
            stderr.contains("NO_WORKER") && !stderr.contains("LOG_FORMAT"),
            "{value:?}: {stderr}"
        );
    }
}

/// A PostgreSQL that takes TLS and plaintext alike (SCRAM over both), with
/// the certificates of scripts/pg-tls-certs.sh.
fn tls_or_plain_server() -> Postgres {
    let dir = tempdir("pg-prefer");
    let common = run_script("pg-tls-certs.sh", &[dir.to_str().expect("UTF-8 path")])
        .expect("make the certificates");
    let hba = dir.join("pg_hba_any.conf");
    std::fs::write(
        &hba,
        "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n",
    )
    .unwrap();
    let tls = dir.join("tls");
    let options = [
        format!("ssl_cert_file={}", tls.join("server.crt").display()),
        format!("ssl_key_file={}", tls.join("server.key").display()),
        format!("hba_file={}", hba.display()),
    ];
    let mut args: Vec<&str> = common.split_whitespace().collect();
    for option in &options {
        args.extend(["-c", option]);
    }
    Postgres::start(&dir, free_port(), &args).expect("start PostgreSQL")
}

/// How many logins the server refused for a wrong password.
fn refused_logins(server: &Postgres) -> usize {
    std::fs::read_to_string(server.dir().join("postgres.log"))
        .unwrap_or_default()
        .matches("password authentication failed")
        .count()
}

/// `sslmode=prefer` and a wrong password: the server refused it over TLS,
/// and the worker does not send it again over plaintext (libpq 15 does:
/// two refused logins per connection, the second in the clear for the
/// `password` method). A server that refuses TLS itself is still tried
/// without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_prefer_with_a_wrong_password_logs_in_once() {
    let server = tls_or_plain_server();
    let port = server.port();
    let before = refused_logins(&server);
    let output = binary()
        .args(["migrate", "--check"])
        .env(
            "DATABASE_URL",
            format!(
                "postgres://postgres:not-the-password@127.0.0.1:{port}/postgres?sslmode=prefer"
            ),
        )
        .output()
        .unwrap();
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    // The server writes its log line as each connection ends: wait for the
    // first, then long enough for a second one to show.
    wait_until("the refused login logged", Duration::from_secs(10), || {
        let logged = refused_logins(&server) > before;
        async move { logged }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = refused_logins(&server) - before;
    assert_eq!(refused, 1, "refused logins: {stderr}");
    // The right password over the same mode connects.
    let password = url::Url::parse(&server.admin_url)
        .unwrap()
        .password()
        .unwrap()
        .to_owned();
    let output = binary()
        .args(["migrate", "--check"])
        .env(
            "DATABASE_URL",
            format!("postgres://postgres:{password}@127.0.0.1:{port}/postgres?sslmode=prefer"),
        )
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3), "{}", stderr_of(&output));
}

/// An X.509 v1 client certificate (`openssl x509 -req` without
/// extensions makes one): rustls takes v3 only. It used to be refused as
/// a key that "cannot be used with sslcert", naming `PGSSLKEY`; it is the
/// certificate, named by its own setting.
#[test]
fn an_x509_v1_client_certificate_is_named_as_the_certificate() {
    let dir = tempdir("v1-cert");
    let script = "set -e; cd \"$1\"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out \"$1\" 2>/dev/null; }
key ca.key; key client.key
openssl req -x509 -new -key ca.key -sha256 -days 30 -subj /CN=ca -out ca.crt 2>/dev/null
openssl req -new -key client.key -subj /CN=tlsuser -out client.csr 2>/dev/null
openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -sha256 -out client.crt 2>/dev/null
chmod 600 client.key";
    let made = std::process::Command::new("bash")
        .args(["-c", script, "bash", dir.to_str().unwrap()])
        .status()
        .expect("run openssl");
    assert!(made.success());
    let version = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(dir.join("client.crt"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&version.stdout).contains("Version: 1 (0x0)"),
        "a v1 certificate"
    );
    let cert = dir.join("client.crt");
    let key = dir.join("client.key");
    for (query, env, named) in [
        (
            format!(
                "sslmode=require&sslcert={}&sslkey={}",
                cert.display(),
                key.display()
            ),
            vec![],
            "DATABASE_URL: sslcert",
        ),
        (
            "sslmode=require".to_owned(),
            vec![("PGSSLCERT", &cert), ("PGSSLKEY", &key)],
            "PGSSLCERT: sslcert",
        ),
    ] {
        let mut command = binary();
        command.arg("once").env(
            "DATABASE_URL",
            format!("postgres://u:hunter2@127.0.0.1:1/crm?{query}"),
        );
        for (name, path) in env {
            command.env(name, path);
        }
        let output = command.output().unwrap();
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(named), "names the certificate: {stderr}");
        assert!(stderr.contains("X.509 v1"), "says why: {stderr}");
        assert!(!stderr.contains("sslkey"), "not the key: {stderr}");
    }
    // The same certificate for Kafka's mutual TLS: `run` refuses it at
    // start, naming the certificate's setting, not the key's.
    let output = binary()
        .arg("run")
        .env("DATABASE_URL", "postgres://u:hunter2@127.0.0.1:1/crm")
        .env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
        .env("KAFKA_SECURITY_PROTOCOL", "SSL")
        .env("KAFKA_SSL_CERTIFICATE_LOCATION", &cert)
        .env("KAFKA_SSL_KEY_LOCATION", &key)
        .output()
        .unwrap();
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("KAFKA_SSL_CERTIFICATE_LOCATION") && stderr.contains("X.509 v1"),
        "names the certificate: {stderr}"
    );
    assert!(
        !stderr.contains("KAFKA_SSL_KEY_LOCATION"),
        "not the key: {stderr}"
    );
}

/// A URL without a host takes it from `PGHOST`: the start-up line says
/// which host that is (it showed `postgres:///db`, as if the default
/// socket were used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_line_names_a_host_from_pghost() {
    let db = TestDb::empty().await;
    let parsed = url::Url::parse(&db.url).unwrap();
    let output = binary()
        .args(["migrate", "--check"])
        .env("DATABASE_URL", format!("postgres://{}", parsed.path()))
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", parsed.port().unwrap().to_string())
        .env("PGUSER", parsed.username())
        .env("PGPASSWORD", parsed.password().unwrap())
        .output()
        .unwrap();
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    let line = stderr
        .lines()
        .find(|line| line.contains("connecting to PostgreSQL"))
        .unwrap_or_else(|| panic!("no start-up line: {stderr}"));
    let port = parsed.port().unwrap();
    assert!(
        line.contains(&format!("127.0.0.1:{port}")) && line.contains("PGHOST"),
        "{line}"
    );
    assert!(!line.contains(parsed.password().unwrap()), "{line}");
}

/// A password file as a Kubernetes Secret volume holds it: root's, group
/// read (the kubelet adds it with `fsGroup`, whatever `defaultMode` says).
/// libpq ignores such a file, and so does the worker, with a warning that
/// names the mode; the documented way, `PGPASSWORD` from the Secret
/// (`secretKeyRef`), connects. deploy/kubernetes shows it and
/// tools/k8s-validate refuses a `PGPASSFILE` inside a Secret volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_file_from_a_secret_volume_is_refused_and_pgpassword_works() {
    let db = TestDb::empty().await;
    let parsed = url::Url::parse(&db.url).unwrap();
    let password = parsed.password().unwrap().to_owned();
    let without_password = db.url.replacen(&format!(":{password}@"), "@", 1);
    let dir = tempdir("secret-volume");
    let file = dir.join("pgpass");
    let mut text = std::fs::File::create(&file).unwrap();
    writeln!(text, "*:*:*:*:{password}").unwrap();
    drop(text);
    // What the kubelet makes of `defaultMode: 0400` (or 0600) with fsGroup.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o440)).unwrap();
    let refused = binary()
        .args(["migrate", "--check"])
        .env("DATABASE_URL", &without_password)
        .env("PGPASSFILE", &file)
        .output()
        .unwrap();
    let stderr = stderr_of(&refused);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("mode 0440"), "names the mode: {stderr}");
    assert!(!stderr.contains(&password), "{stderr}");
    let documented = binary()
        .args(["migrate", "--check"])
        .env("DATABASE_URL", &without_password)
        .env("PGPASSWORD", &password)
        .output()
        .unwrap();
    assert_eq!(
        documented.status.code(),
        Some(3),
        "{}",
        stderr_of(&documented)
    );
}
