//! No secret reaches any output, against the real binary, PostgreSQL, Kafka
//! and an OpenTelemetry Collector: for a handful of adversarial passwords
//! (`/`, `@`, `?`, `#`, `:`, `%`, quotes, spaces, beyond ASCII, and random
//! ones), used as the database password (in the URL, in `PGPASSWORD`, in
//! a password file named by `PGPASSFILE` and in `~/.pgpass`),
//! `KAFKA_SASL_PASSWORD` and the content of key files, nothing the process
//! writes holds them, raw or
//! percent-encoded: start-up and error logs (text and JSON, at debug),
//! exit-2 and exit-1 lines, `status` (text and `--json`), `once`,
//! `/metrics`, `/healthz`, `/readyz`, the exported spans' attributes and
//! `--help`. (`Debug` of the settings, which a panic message would print,
//! is checked with many more passwords by the unit property tests in
//! src/libpq/conninfo.rs and src/libpq/url.rs.)
//!
//! Also: `sslmode` is obeyed whatever the password holds (issue 25: a `?`
//! in the password hid it, and `require` became `prefer`).

use std::time::Duration;

use booking_expiration::libpq::url::{PgUrl, percent_encode as encode_all};
use proptest::{
    strategy::{Strategy, ValueTree},
    test_runner::TestRunner,
};

use crate::support::*;

/// Environment variables for one run of the binary.
type Env = Vec<(&'static str, String)>;

/// The passwords: adversarial ones written by hand, and random printable
/// ones (a fixed seed: the same ones every run).
fn passwords() -> Vec<String> {
    let mut passwords: Vec<String> = [
        "ab/cd+ef==Q9xk",
        "p@ss:w?rd#1 x/y@z",
        "ünï/cøde@?:# z%41",
        "'; select 1; -- \"q\\ &sslmode=disable",
    ]
    .map(str::to_owned)
    .to_vec();
    let mut runner = TestRunner::deterministic();
    let random = proptest::string::string_regex("[ -~]{14,24}").expect("a pattern");
    for _ in 0..2 {
        passwords.push(random.new_tree(&mut runner).expect("a password").current());
    }
    passwords
}

/// `text` holds neither form of any secret.
fn assert_hidden(what: &str, text: &str, secrets: &[&str]) {
    for secret in secrets {
        for form in [secret.to_string(), encode_all(secret)] {
            assert!(
                !text.contains(&form),
                "{what} shows a secret ({form:?}):\n{text}"
            );
        }
    }
}

/// A URL for `role` with `password` as it is when that parses to the same
/// password, else percent-encoded.
fn url_for(base: &url::Url, role: &str, password: &str, query: &str) -> String {
    let rest = format!(
        "@{}:{}{}{query}",
        base.host_str().expect("a host"),
        base.port().expect("a port"),
        base.path()
    );
    let raw = format!("postgres://{role}:{password}{rest}");
    let exact = PgUrl::parse(&raw)
        .ok()
        .and_then(|url| url.password().map(|p| p.expose() == password.as_bytes()))
        .unwrap_or(false);
    if exact {
        raw
    } else {
        format!("postgres://{role}:{}{rest}", encode_all(password))
    }
}

/// The URL of `role` without a password.
fn bare_url(base: &url::Url, role: &str) -> String {
    format!(
        "postgres://{role}@{}:{}{}",
        base.host_str().expect("a host"),
        base.port().expect("a port"),
        base.path()
    )
}

/// A `.pgpass` line (0600 file) for `role` on `base` with `password`,
/// escaped as libpq reads it.
fn pgpass_file(path: &std::path::Path, base: &url::Url, role: &str, password: &str) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let line = format!(
        "*:{}:*:{role}:{}\n",
        base.port().expect("a port"),
        password.replace('\\', "\\\\").replace(':', "\\:")
    );
    std::fs::write(path, line).expect("write the password file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    path.display().to_string()
}

/// Runs the binary with `env`; (exit code, stdout and stderr together).
fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let output = binary()
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run the binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

/// A PEM file whose body is the secret (a key file's content).
fn pem_file(dir: &std::path::Path, name: &str, label: &str, secret: &str) -> String {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!("-----BEGIN {label}-----\n{secret}\n-----END {label}-----\n"),
    )
    .expect("write a PEM file");
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_any_output() {
    let passwords = passwords();
    let escaped: Vec<String> = passwords.iter().map(|p| p.replace('\'', "''")).collect();
    let options: Vec<String> = escaped
        .iter()
        .map(|p| format!("LOGIN PASSWORD '{p}'"))
        .collect();
    let names: Vec<String> = (0..passwords.len()).map(|i| format!("p{i}")).collect();
    let specs: Vec<(&str, &str)> = names
        .iter()
        .zip(&options)
        .map(|(n, o)| (n.as_str(), o.as_str()))
        .collect();
    let roles = TestRoles::create(&specs).await;
    let db = TestDb::new().await;
    for role in &roles.names {
        db.grant_worker(&db.url, role).await;
    }
    let base = url::Url::parse(&db.url).expect("the test database's URL");
    let collector = Collector::start().await;
    let files = tempdir("secret-files");
    let past = wall_now() - chrono::Duration::minutes(5);

    for (i, (password, role)) in passwords.iter().zip(&roles.names).enumerate() {
        let secrets = [password.as_str()];
        let url = url_for(&base, role, password, "");
        let json = if i % 2 == 0 { "json" } else { "text" };
        let logs = [("RUST_LOG", "debug"), ("LOG_FORMAT", json)];
        let with_url = |extra: &[(&'static str, &str)]| -> Env {
            let mut env: Env = logs.iter().map(|(k, v)| (*k, v.to_string())).collect();
            env.push(("DATABASE_URL", url.clone()));
            env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
            env
        };
        let call = |args: &[&str], env: Env| {
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            run(args, &env)
        };

        // status and once: exit 0.
        db.insert_all(
            &(0..3)
                .map(|_| NewBooking::new("Reserved").reserve_deadline(past))
                .collect::<Vec<_>>(),
        )
        .await;
        for args in [&["status"][..], &["status", "--json"], &["once"]] {
            let (code, text) = call(args, with_url(&[]));
            assert_eq!(code, Some(0), "{args:?}: {text}");
            assert_hidden(&format!("{args:?}"), &text, &secrets);
        }

        // The password from libpq's other sources: PGPASSWORD, a file
        // named by PGPASSFILE, and ~/.pgpass through HOME.
        let bare = bare_url(&base, role);
        let home = files.join(format!("home{i}"));
        std::fs::create_dir_all(&home).expect("a home");
        let passfile = pgpass_file(&files.join(format!("pgpass{i}")), &base, role, password);
        let dot_pgpass = pgpass_file(&home.join(".pgpass"), &base, role, password);
        let home = home.display().to_string();
        // (the source the first line names, the environment that gives it)
        let sources: [(String, Env); 3] = [
            (
                "PGPASSWORD".to_owned(),
                vec![("PGPASSWORD", password.clone())],
            ),
            (
                format!("passfile {passfile}"),
                vec![("PGPASSFILE", passfile.clone())],
            ),
            (
                format!("passfile {dot_pgpass}"),
                vec![("HOME", home.clone())],
            ),
        ];
        for (source, extra) in &sources {
            let env = || -> Env {
                let mut env: Env = logs.iter().map(|(k, v)| (*k, v.to_string())).collect();
                env.push(("DATABASE_URL", bare.clone()));
                env.extend(extra.iter().cloned());
                env
            };
            for args in [&["status", "--json"][..], &["once"]] {
                let (code, text) = call(args, env());
                assert_eq!(code, Some(0), "{source} {args:?}: {text}");
                assert!(
                    text.contains(&format!(
                        "password{}{source}",
                        if json == "json" { "\":\"" } else { "=" }
                    )),
                    "{source}: {text}"
                );
                assert_hidden(&format!("{source} {args:?}"), &text, &secrets);
            }
            // Exit 2: a bad setting beside the secret.
            let mut bad = env();
            bad.push(("EXPIRATION_BATCH_SIZE", "0".to_owned()));
            let (code, text) = call(&["once"], bad);
            assert_eq!(code, Some(2), "{source}: {text}");
            assert_hidden(&format!("exit 2 with {source}"), &text, &secrets);
        }

        // Exit 2: a bad setting beside each secret.
        let key = pem_file(&files, &format!("key{i}.pem"), "PRIVATE KEY", password);
        let cert = pem_file(&files, &format!("cert{i}.pem"), "CERTIFICATE", password);
        let bad_tls = url_for(
            &base,
            role,
            password,
            &format!("?sslmode=require&sslcert={cert}&sslkey={key}"),
        );
        let raw_bad = format!(
            "postgres://{role}:{password}@{}:{}/x?sslmode=verify",
            base.host_str().unwrap(),
            base.port().unwrap()
        );
        let exit_2: Vec<(&[&str], Env)> = vec![
            (
                &["status"],
                vec![(
                    "DATABASE_URL",
                    url_for(&base, role, password, "?sslmode=verify"),
                )],
            ),
            (&["status"], vec![("DATABASE_URL", raw_bad)]),
            (&["status"], vec![("DATABASE_URL", bad_tls)]),
            (
                &["run"],
                with_url(&[
                    ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9"),
                    ("KAFKA_SASL_MECHANISM", "PLAIN"),
                    ("KAFKA_SASL_PASSWORD", password),
                ]),
            ),
            (
                &["run"],
                with_url(&[
                    ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9"),
                    ("KAFKA_SECURITY_PROTOCOL", "SSL"),
                    ("KAFKA_SSL_CERTIFICATE_LOCATION", &cert),
                    ("KAFKA_SSL_KEY_LOCATION", &key),
                ]),
            ),
            (
                &["run"],
                with_url(&[
                    ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9"),
                    ("KAFKA_SECURITY_PROTOCOL", "SSL"),
                    ("KAFKA_SSL_CA_LOCATION", &key),
                ]),
            ),
        ];
        for (args, env) in exit_2 {
            let (code, text) = call(args, env);
            assert_eq!(code, Some(2), "{args:?}: {text}");
            assert_eq!(text.trim_end().lines().count(), 1, "{text}");
            assert_hidden(&format!("exit 2 of {args:?}"), &text, &secrets);
        }

        // Exit 1: a wrong password (itself a secret), one line.
        let wrong = format!("{password}Zq");
        let (code, text) = call(
            &["status"],
            vec![("DATABASE_URL", url_for(&base, role, &wrong, ""))],
        );
        assert_eq!(code, Some(1), "{text}");
        assert!(text.contains("password authentication failed"), "{text}");
        assert_hidden("exit 1", &text, &[&wrong, password]);
        // The same from PGPASSWORD and from the password file.
        let wrong_file = pgpass_file(&files.join(format!("wrong{i}")), &base, role, &wrong);
        for extra in [("PGPASSWORD", wrong.clone()), ("PGPASSFILE", wrong_file)] {
            let (code, text) = call(
                &["status"],
                vec![
                    ("DATABASE_URL", bare_url(&base, role)),
                    extra.clone(),
                    ("RUST_LOG", "debug".to_owned()),
                ],
            );
            assert_eq!(code, Some(1), "{}: {text}", extra.0);
            assert!(text.contains("password authentication failed"), "{text}");
            assert_hidden(
                &format!("exit 1 with {}", extra.0),
                &text,
                &[&wrong, password],
            );
        }

        // --help with every secret set.
        for args in [&["--help"][..], &["run", "--help"], &["status", "--help"]] {
            let (code, text) = call(
                args,
                with_url(&[("KAFKA_SASL_PASSWORD", password), ("PGPASSWORD", password)]),
            );
            assert_eq!(code, Some(0), "{text}");
            assert_hidden("--help", &text, &secrets);
        }

        // run: logs, the HTTP endpoints and the exported spans, with SASL
        // refused by the broker (its PLAINTEXT listener speaks no SASL);
        // the database password from the URL, PGPASSWORD or the password
        // file in turn.
        let addr = format!("127.0.0.1:{}", free_port());
        let (source, source_env) = match i % 3 {
            0 => ("url".to_owned(), Vec::new()),
            n => sources[n - 1].clone(),
        };
        let mut command = binary();
        let mut run_env = with_url(&[
            ("KAFKA_BOOTSTRAP_SERVERS", &kafka_bootstrap().join(",")),
            ("KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT"),
            ("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
            ("KAFKA_SASL_USERNAME", "booking-expiration"),
            ("KAFKA_SASL_PASSWORD", password),
            ("KAFKA_REQUEST_TIMEOUT", "2s"),
            ("EXPIRATION_INTERVAL", "1s"),
            ("METRICS_ADDR", &addr),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                &format!("http://{}", collector.endpoint),
            ),
            ("OTEL_TRACES_SAMPLER", "always_on"),
        ]);
        if !source_env.is_empty() {
            run_env.retain(|(k, _)| *k != "DATABASE_URL");
            run_env.push(("DATABASE_URL", bare.clone()));
            run_env.extend(source_env);
        }
        command.arg("run").envs(run_env);
        db.insert_all(
            &(0..2)
                .map(|_| NewBooking::new("Booked").booking_deadline(past))
                .collect::<Vec<_>>(),
        )
        .await;
        let mut running = Running::spawn(command);
        wait_http_status(&addr, "/readyz", 503, Duration::from_secs(30)).await;
        wait_until(
            "a produce error counted",
            Duration::from_secs(30),
            || async {
                http_get(&addr, "/metrics")
                    .await
                    .is_some_and(|(_, body)| body.contains("produce_errors_total{"))
            },
        )
        .await;
        for path in ["/metrics", "/healthz", "/readyz"] {
            let (_, body) = http_get(&addr, path).await.expect(path);
            assert_hidden(path, &body, &secrets);
        }
        running.terminate();
        assert_eq!(running.wait(Duration::from_secs(30)).await.code(), Some(0));
        let stderr = running.stderr();
        if source == "url" {
            assert!(
                stderr.contains(":***@"),
                "the redacted URL is logged: {stderr}"
            );
        }
        assert!(stderr.contains(&source), "password from {source}: {stderr}");
        assert_hidden(&format!("the logs of run ({source})"), &stderr, &secrets);
    }

    wait_until("spans exported", Duration::from_secs(30), || async {
        collector.exported().contains("expiry_cycle")
    })
    .await;
    let exported = collector.exported();
    for password in &passwords {
        assert_hidden("the exported spans", &exported, &[password]);
    }
    collector.stop().await;
}

/// Issue 25: the URL was split at the first `?`, so a `?` in the password
/// hid `sslmode=require`, which became libpq's default `prefer` and fell
/// back to plaintext on a server without TLS (the test PostgreSQL has
/// none). Now `require` fails there, as in libpq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_is_obeyed_whatever_the_password_holds() {
    let roles = TestRoles::create(&[("qmark", "LOGIN PASSWORD 'pa?ss#wo rd'")]).await;
    let role = &roles.names[0];
    let db = TestDb::new().await;
    db.grant_worker(&db.url, role).await;
    let base = url::Url::parse(&db.url).expect("the test database's URL");
    let url = |query: &str| {
        format!(
            "postgres://{role}:pa?ss#wo rd@{}:{}{}?{query}",
            base.host_str().unwrap(),
            base.port().unwrap(),
            base.path()
        )
    };
    let (code, text) = run(&["status"], &[("DATABASE_URL", &url("sslmode=disable"))]);
    assert_eq!(code, Some(0), "the password is right: {text}");
    for query in ["sslmode=require", "application_name=x&sslmode=require"] {
        let (code, text) = run(
            &["status"],
            &[("DATABASE_URL", &url(query)), ("RUST_LOG", "off")],
        );
        assert_eq!(code, Some(1), "{query}: plaintext was used: {text}");
        assert!(text.contains("TLS"), "{text}");
        assert!(!text.contains("pa?ss"), "{text}");
    }
}
