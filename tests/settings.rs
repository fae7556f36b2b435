//! The command line as the binary reads it, against the settings'
//! declarations (`src/config/catalog.rs`): every command's defaults, the
//! names of every flag and variable, each setting at and past the bounds
//! of its range (and any text, by property tests), the rules that span
//! settings, and no secret in any `Debug` or error of the settings.
//!
//! It parses command lines only, so it needs no server.

use std::{path::PathBuf, time::Duration};

use booking_expiration::config::{
    Cli, Command, ConfigError, EventSettings, ExpirySettings, HttpSettings, Pooler,
    PublisherSettings, SaslMechanism, Settings, ShutdownSettings, catalog, defaults,
    setting::Bounds,
};
use clap::{CommandFactory, FromArgMatches};

/// Parses `args` as the binary would, with the environment ignored so
/// the outcome depends on the arguments alone.
fn parse(args: &[&str]) -> Result<Command, clap::Error> {
    let command =
        Cli::command().mut_subcommands(|sub| sub.mut_args(|arg| arg.env(None::<&'static str>)));
    let matches = command
        .try_get_matches_from(std::iter::once("booking-expiration").chain(args.iter().copied()))?;
    Ok(Cli::from_arg_matches(&matches)?.command)
}

fn run(args: &[&str]) -> Result<Settings, ConfigError> {
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    match parse(&all) {
        Ok(Command::Run(args)) => Settings::from_args(args),
        Ok(other) => panic!("not run: {other:?}"),
        Err(error) => Err(ConfigError::from_clap(&error)
            .unwrap_or_else(|| panic!("not a setting error: {error}"))),
    }
}

const REQUIRED: [&str; 4] = [
    "--database-url",
    "postgres://u:hunter2@h/db",
    "--kafka-bootstrap-servers",
    "h:9092",
];

#[test]
fn the_command_line_is_well_formed() {
    Cli::command().debug_assert();
}

#[test]
fn run_without_settings_gets_the_defaults() {
    let settings = run(&REQUIRED).unwrap();
    assert_eq!(settings.expiry, ExpirySettings::default());
    assert_eq!(settings.events, EventSettings::default());
    assert_eq!(settings.publisher, PublisherSettings::default());
    assert_eq!(settings.http, HttpSettings::default());
    assert_eq!(settings.shutdown, ShutdownSettings::default());
    assert_eq!(settings.database.pool_size, defaults::DATABASE_POOL_SIZE);
    assert_eq!(
        settings.database.connect_timeout,
        defaults::DATABASE_CONNECT_TIMEOUT
    );
    assert_eq!(
        settings.database.statement_timeout,
        defaults::DATABASE_STATEMENT_TIMEOUT
    );
    assert_eq!(settings.database.pooler, defaults::DATABASE_POOLER);
    assert_eq!(settings.database.direct_url, None);
    let kafka = settings.kafka.expect("the publisher runs by default");
    assert_eq!(kafka.bootstrap_servers, ["h:9092"]);
    assert_eq!(kafka.client_id, defaults::KAFKA_CLIENT_ID);
    assert_eq!(kafka.request_timeout, defaults::KAFKA_REQUEST_TIMEOUT);
    assert_eq!(kafka.topic_partitions, defaults::KAFKA_TOPIC_PARTITIONS);
    assert_eq!(kafka.replication_factor, defaults::KAFKA_REPLICATION_FACTOR);
    assert_eq!(kafka.compression, defaults::KAFKA_COMPRESSION);
    assert_eq!(kafka.sasl, None);
    assert!(settings.roles.worker && settings.roles.publisher);

    let Command::Seed { seed, .. } = parse(&["seed"]).unwrap() else {
        panic!("seed");
    };
    assert_eq!(seed.active, defaults::SEED_ACTIVE);
    assert_eq!(seed.due_fraction, defaults::SEED_DUE_FRACTION);
    assert_eq!((seed.inactive, seed.poison), (0, 0));
    assert_eq!(seed.spread, defaults::SEED_SPREAD);

    let Command::Republish(republish) = parse(&[
        "republish",
        "--tenant",
        "00000000-0000-0000-0000-000000000001",
    ])
    .unwrap() else {
        panic!("republish");
    };
    assert_eq!(republish.batch.batch_size, defaults::REPUBLISH_BATCH_SIZE);
    assert_eq!((republish.after, republish.dry_run), (0, false));
    assert_eq!(republish.events.topic, defaults::KAFKA_TOPIC);
    let Command::Republish(window) = parse(&[
        "republish",
        "--expired-from",
        "2026-12-01T00:00:00Z",
        "--expired-to",
        "2026-12-02T00:00:00+01:00",
    ])
    .unwrap() else {
        panic!("republish");
    };
    assert_eq!(
        window.expired_to.map(|t| t.to_rfc3339()),
        Some("2026-12-01T23:00:00+00:00".to_owned())
    );
    assert!(parse(&["republish", "--expired-from", "yesterday"]).is_err());
}

/// Every setting's argument is named after its variable (its id, and its
/// flag in lower case with `-`), and every declared setting is an
/// argument of some command: none is declared and left out. (The names
/// themselves are held by docs/configuration.md, which `tests/docs.rs`
/// checks against the declarations and `--help` both ways.)
#[test]
fn every_declared_setting_is_an_argument_named_after_it() {
    let mut arguments = std::collections::BTreeSet::new();
    for (_, arg) in all_arguments() {
        if let Some(env) = arg.get_env().and_then(|env| env.to_str()) {
            assert_eq!(arg.get_id(), env, "a setting's id is its variable");
            let flag = env.to_lowercase().replace('_', "-");
            assert_eq!(arg.get_long(), Some(flag.as_str()), "{env}'s flag");
        }
        if let Some(key) = setting_key(&arg) {
            arguments.insert(key);
        }
    }
    for setting in catalog::ALL {
        assert!(
            arguments.contains(setting.name()),
            "{} is declared but no command takes it",
            setting.name()
        );
    }
}

#[test]
fn a_bad_value_is_a_setting_error_without_the_value() {
    let error = run(&[&REQUIRED[..], &["--expiration-batch-size", "0"]].concat()).unwrap_err();
    assert_eq!(
        error,
        ConfigError::new("EXPIRATION_BATCH_SIZE", "must be from 1 to 100000, got 0")
    );
    let error = run(&["--database-url", "mysql://u:hunter2@h/db"]).unwrap_err();
    assert_eq!(error.setting, "DATABASE_URL");
    assert!(!error.to_string().contains("hunter2"), "{error}");
    let Err(error) = parse(&["seed", "--due-fraction", "2"]) else {
        panic!("--due-fraction 2 accepted");
    };
    let error = ConfigError::from_clap(&error).expect("a setting error");
    assert_eq!(
        error.to_string(),
        "--due-fraction: \"2\" is not between 0 and 1"
    );
    let Err(error) = parse(&["run", "--no-such-flag"]) else {
        panic!("unknown flag accepted");
    };
    assert_eq!(
        ConfigError::from_clap(&error),
        None,
        "clap's own usage error"
    );
}

#[test]
fn the_pooler_and_the_direct_url() {
    let settings = run(&[
        &REQUIRED[..],
        &[
            "--database-pooler",
            "transaction",
            "--database-direct-url",
            "postgres://u:hunter2@db:5432/crm",
        ],
    ]
    .concat())
    .unwrap();
    assert_eq!(settings.database.pooler, Pooler::Transaction);
    assert!(settings.database.direct_url.is_some());
    let error = run(&[&REQUIRED[..], &["--database-pooler", "statement"]].concat()).unwrap_err();
    assert_eq!(error.setting, "DATABASE_POOLER");
    let error = run(&[
        &REQUIRED[..],
        &["--database-direct-url", "mysql://u:hunter2@db/crm"],
    ]
    .concat())
    .unwrap_err();
    assert_eq!(error.setting, "DATABASE_DIRECT_URL");
    assert!(!error.to_string().contains("hunter2"), "{error}");
}

#[test]
fn rules_that_span_settings() {
    let with = |extra: &[&str]| run(&[&REQUIRED[..], extra].concat());
    assert_eq!(
        with(&["--no-worker", "--no-publisher"])
            .unwrap_err()
            .setting,
        "NO_WORKER"
    );
    assert_eq!(
        run(&["--database-url", "postgres://h/db"])
            .unwrap_err()
            .setting,
        "KAFKA_BOOTSTRAP_SERVERS"
    );
    let worker_only = run(&["--database-url", "postgres://h/db", "--no-publisher"]).unwrap();
    assert_eq!(worker_only.kafka, None);
    assert!(!worker_only.roles.publisher);
    assert_eq!(
        with(&["--kafka-sasl-mechanism", "PLAIN"])
            .unwrap_err()
            .setting,
        "KAFKA_SASL_USERNAME"
    );
    assert_eq!(
        with(&[
            "--kafka-sasl-mechanism",
            "PLAIN",
            "--kafka-sasl-username",
            "u"
        ])
        .unwrap_err()
        .setting,
        "KAFKA_SASL_PASSWORD"
    );
    let sasl = with(&[
        "--kafka-sasl-mechanism",
        "plain",
        "--kafka-sasl-username",
        "u",
        "--kafka-sasl-password",
        "p",
    ])
    .unwrap();
    let sasl = sasl.kafka.and_then(|k| k.sasl).expect("SASL");
    assert_eq!(sasl.mechanism, SaslMechanism::Plain);
    assert!(
        with(&["--kafka-sasl-mechanism", ""])
            .unwrap()
            .kafka
            .unwrap()
            .sasl
            .is_none()
    );
    // No transaction waits on Kafka: its timeout and the statement
    // timeout no longer constrain each other.
    assert!(
        with(&[
            "--kafka-request-timeout",
            "5m",
            "--database-statement-timeout",
            "1s"
        ])
        .is_ok()
    );
}

#[test]
fn the_liveness_window_spans_a_tick() {
    let with = |extra: &[&str]| run(&[&REQUIRED[..], extra].concat());
    for (window, interval) in [("60s", "60s"), ("1s", "2s")] {
        let error = with(&[
            "--liveness-window",
            window,
            "--expiration-interval",
            interval,
        ])
        .unwrap_err();
        assert_eq!(error.setting, "LIVENESS_WINDOW");
        assert!(error.problem.contains("EXPIRATION_INTERVAL"), "{error}");
    }
    assert!(
        with(&[
            "--liveness-window",
            "1500ms",
            "--expiration-interval",
            "300ms"
        ])
        .is_ok()
    );
    assert!(
        with(&[
            "--liveness-window",
            "1s",
            "--expiration-interval",
            "1h",
            "--no-worker"
        ])
        .is_ok(),
        "no worker, no cycles to wait for"
    );
}

/// How a setting is written on the command line and named in errors:
/// its variable, or its flag for flags without one.
fn setting_key(arg: &clap::Arg) -> Option<String> {
    match arg.get_env() {
        Some(env) => env.to_str().map(str::to_owned),
        None => arg.get_long().map(|long| format!("--{long}")),
    }
}

/// Every argument of every command, with the command's path.
fn all_arguments() -> Vec<(Vec<String>, clap::Arg)> {
    fn walk(command: &clap::Command, path: Vec<String>, out: &mut Vec<(Vec<String>, clap::Arg)>) {
        for arg in command.get_arguments() {
            out.push((path.clone(), arg.clone()));
        }
        for sub in command.get_subcommands() {
            let mut path = path.clone();
            path.push(sub.get_name().to_owned());
            walk(sub, path, out);
        }
    }
    let mut out = Vec::new();
    walk(&Cli::command(), Vec::new(), &mut out);
    out
}

/// A setting with a range: its name, the range as written, its bounds.
struct Ranged {
    setting: &'static str,
    text: String,
    bounds: Bounds,
}

fn ranged() -> Vec<Ranged> {
    catalog::ALL
        .iter()
        .filter_map(|setting| {
            Some(Ranged {
                setting: setting.name(),
                text: setting.range_text()?,
                bounds: setting.bounds()?,
            })
        })
        .collect()
}

/// Every argument whose value is a duration or a count has a range in
/// its declaration, and its `--help` shows it; every range belongs to
/// an argument.
#[test]
fn every_duration_and_count_setting_has_its_range_in_help() {
    use std::any::TypeId;
    let durations = [TypeId::of::<Duration>(), TypeId::of::<Option<Duration>>()];
    let counts = [
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<i32>(),
        TypeId::of::<i16>(),
    ];
    let ranged = ranged();
    let mut seen = std::collections::BTreeSet::new();
    for (path, arg) in all_arguments() {
        let value = arg.get_value_parser().type_id();
        let is_duration = durations.iter().any(|t| value == *t);
        let is_count = counts.iter().any(|t| value == *t);
        if !is_duration && !is_count {
            continue;
        }
        let key = setting_key(&arg).expect("a flag or a variable");
        let Some(range) = ranged.iter().find(|r| r.setting == key) else {
            panic!("{path:?} {key}: no range in its declaration");
        };
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        assert!(
            help.contains(&range.text),
            "{key}: --help {help:?} does not say {:?}",
            range.text
        );
        seen.insert(key);
    }
    let listed: std::collections::BTreeSet<String> =
        ranged.iter().map(|r| r.setting.to_owned()).collect();
    assert_eq!(seen, listed, "ranges without an argument, or the reverse");
}

/// The command line that sets `setting` to `value`, and what the
/// command makes of it: settings validated as the binary would.
fn outcome_of(setting: &str, value: &str) -> Result<(), ConfigError> {
    let flag = if setting.starts_with("--") {
        setting.to_owned()
    } else {
        format!("--{}", setting.to_lowercase().replace('_', "-"))
    };
    let command: Vec<&str> = match setting {
        "--spread" | "--active" | "--inactive" | "--poison" => vec!["seed"],
        "--batch-size" => vec![
            "republish",
            "--tenant",
            "00000000-0000-0000-0000-000000000001",
        ],
        _ => {
            let mut run = vec!["run"];
            run.extend_from_slice(&REQUIRED);
            run
        }
    };
    let mut args = command;
    // `--flag=value`: a value such as "-1s" is the flag's value, not a flag.
    let pair = format!("{flag}={value}");
    args.push(&pair);
    match parse(&args) {
        Ok(Command::Run(run)) => {
            let settings = Settings::from_args(run)?;
            // What start computes from them must not panic either.
            let _ = settings.stop_grace();
            let idle = settings.database.idle_in_transaction_timeout();
            assert!(
                idle <= catalog::POSTGRES_MAX_TIMEOUT,
                "{setting}={value}: {idle:?}"
            );
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(error) => Err(ConfigError::from_clap(&error)
            .unwrap_or_else(|| panic!("{setting}={value}: not a setting error: {error}"))),
    }
}

/// What a value outside a setting's range, or no value of its kind,
/// must give: the setting named, with its range.
fn assert_refused_with_range(setting: &str, value: &str, range: &str) {
    match outcome_of(setting, value) {
        Ok(()) => panic!("{setting}={value:?} accepted, outside {range}"),
        Err(error) => {
            assert_eq!(error.setting, setting, "{setting}={value:?}: {error}");
            assert!(
                error.problem.contains(range),
                "{setting}={value:?}: {error}"
            );
        }
    }
}

/// A value inside a setting's range starts, or meets a rule that spans
/// settings (named, with the other setting): never a range error.
fn assert_starts(setting: &str, value: &str, range: &str) {
    if let Err(error) = outcome_of(setting, value) {
        let rules = ["LIVENESS_WINDOW"];
        assert!(
            rules.contains(&error.setting.as_str()) && !error.problem.contains(range),
            "{setting}={value:?} is inside {range} but: {error}"
        );
    }
}

fn duration_text(duration: Duration) -> String {
    format!("{}ns", duration.as_nanos())
}

/// Every duration and count setting at its extremes: 0, 1, min-1,
/// min, max-1, max, max+1, u64::MAX-ish, negative and garbage. Each is
/// an exit-2 error naming the setting and its range, or settings that
/// start; never a panic.
#[test]
fn every_setting_at_its_extremes_starts_or_names_its_range() {
    let unit = Duration::from_millis(1);
    for Ranged {
        setting,
        text,
        bounds,
    } in ranged()
    {
        match bounds {
            Bounds::Duration { min, max, off } => {
                for value in [min, min + unit, max - unit, max] {
                    assert_starts(setting, &duration_text(value), &text);
                }
                let mut outside = vec![
                    max + unit,
                    Duration::from_secs(10_000_000 * 86_400),
                    Duration::from_secs(u64::MAX),
                ];
                if !min.is_zero() {
                    outside.extend([Duration::ZERO, min - unit]);
                }
                for value in outside {
                    assert_refused_with_range(setting, &duration_text(value), &text);
                }
                for value in [
                    "10000000d",
                    "18446744073709551615s",
                    "18446744073709551616s",
                    "-1s",
                    "-5",
                    "1",
                    "soon",
                    "",
                    "1.5.2s",
                    "NaN",
                ] {
                    assert_refused_with_range(setting, value, &text);
                }
                assert_eq!(outcome_of(setting, "off").is_ok(), off, "{setting}=off");
            }
            Bounds::Count { min, max } => {
                for value in [min, min + 1, max - 1, max] {
                    assert_starts(setting, &value.to_string(), &text);
                }
                let mut outside = vec![
                    i128::from(max) + 1,
                    i128::from(u64::MAX),
                    i128::from(u64::MAX) + 1,
                    -1,
                    i128::MIN,
                ];
                if min > 0 {
                    outside.extend([0, i128::from(min) - 1]);
                }
                for value in outside {
                    assert_refused_with_range(setting, &value.to_string(), &text);
                }
                for value in [
                    "abc",
                    "",
                    "1.5",
                    "1e3",
                    "0x10",
                    "999999999999999999999999999999999999999999",
                ] {
                    assert_refused_with_range(setting, value, &text);
                }
            }
        }
    }
}

#[test]
fn kafka_security_protocol_agrees_with_sasl_and_tls_settings() {
    use booking_expiration::config::SecurityProtocol::*;
    let with = |extra: &[&str]| run(&[&REQUIRED[..], extra].concat());
    let protocol = |extra: &[&str]| with(extra).map(|s| s.kafka.unwrap().security_protocol());
    let sasl = [
        "--kafka-sasl-mechanism",
        "SCRAM-SHA-512",
        "--kafka-sasl-username",
        "u",
        "--kafka-sasl-password",
        "hunter2",
    ];
    assert_eq!(protocol(&[]), Ok(Plaintext));
    assert_eq!(protocol(&sasl), Ok(SaslPlaintext), "as before the setting");
    assert_eq!(
        protocol(&[&sasl[..], &["--kafka-security-protocol", "sasl_ssl"]].concat()),
        Ok(SaslSsl)
    );
    assert_eq!(
        protocol(&["--kafka-security-protocol", "Ssl"]),
        Ok(Ssl),
        "any case, as librdkafka"
    );
    let error = with(&[&sasl[..], &["--kafka-security-protocol", "SSL"]].concat()).unwrap_err();
    assert_eq!(error.setting, "KAFKA_SASL_MECHANISM");
    assert!(error.problem.contains("SSL uses no SASL"), "{error}");
    let error = with(&["--kafka-security-protocol", "SASL_SSL"]).unwrap_err();
    assert_eq!(error.setting, "KAFKA_SASL_MECHANISM");
    let error = with(&["--kafka-ssl-ca-location", "/etc/ca.pem"]).unwrap_err();
    assert_eq!(error.setting, "KAFKA_SSL_CA_LOCATION");
    assert!(error.problem.contains("PLAINTEXT uses no TLS"), "{error}");
    let tls = ["--kafka-security-protocol", "SSL"];
    let error =
        with(&[&tls[..], &["--kafka-ssl-certificate-location", "/c.pem"]].concat()).unwrap_err();
    assert_eq!(error.setting, "KAFKA_SSL_KEY_LOCATION");
    let error = with(&[&tls[..], &["--kafka-ssl-key-location", "/k.pem"]].concat()).unwrap_err();
    assert_eq!(error.setting, "KAFKA_SSL_CERTIFICATE_LOCATION");
    let settings = with(&tls).unwrap().kafka.unwrap();
    assert_eq!(settings.tls.unwrap().ca, None, "the bundled roots");
    // Parsing takes the path as it is; the start-up check that follows
    // reads the file (`app`'s tests).
    let settings = with(
        &[
            &tls[..],
            &["--kafka-ssl-ca-location", "/nonexistent/ca.pem"],
        ]
        .concat(),
    )
    .unwrap()
    .kafka
    .unwrap();
    assert_eq!(
        settings.tls.unwrap().ca,
        Some(PathBuf::from("/nonexistent/ca.pem"))
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

    /// Any text for any duration or count setting: a value inside the
    /// range starts (or meets a rule that spans settings), anything
    /// else names the setting and its range; nothing panics.
    #[test]
    fn any_value_of_any_setting_starts_or_names_its_range(
        index in 0..ranged().len(),
        number in proptest::prop_oneof![
            0u64..2_000,
            0u64..100_000_000,
            proptest::num::u64::ANY,
        ],
        unit in proptest::sample::select(vec!["", "ns", "ms", "s", "m", "h", "d", "w", "y"]),
        garbage in "[ -~]{0,12}",
        form in 0..4u8,
    ) {
        let text = match form {
            0 => format!("{number}{unit}"),
            1 => format!("-{number}{unit}"),
            2 => garbage.clone(),
            _ => format!("{number}"),
        };
        let Ranged { setting, text: range, bounds } = &ranged()[index];
        match *bounds {
            Bounds::Duration { min, max, off } => {
                let parsed = humantime::parse_duration(text.trim()).ok();
                match parsed {
                    Some(value) if (min..=max).contains(&value) => assert_starts(setting, &text, range),
                    _ if off && text.trim() == "off" => proptest::prop_assert!(outcome_of(setting, &text).is_ok()),
                    _ => assert_refused_with_range(setting, &text, range),
                }
            }
            Bounds::Count { min, max } => {
                // As the parser reads it: "-0" and "+5" are numbers too.
                let value = text.trim().parse::<i128>().ok().and_then(|v| u64::try_from(v).ok());
                match value {
                    Some(value) if (min..=max).contains(&value) => assert_starts(setting, &text, range),
                    _ => assert_refused_with_range(setting, &text, range),
                }
            }
        }
    }

    /// `Debug` of the parsed command line and of the settings (what a
    /// panic message or a `{:?}` in a log would print), and every
    /// setting error, hold neither the database password (in the URL
    /// raw, or percent-encoded, or `PGPASSWORD`) nor `KAFKA_SASL_PASSWORD`.
    #[test]
    fn no_debug_of_the_settings_holds_a_secret(
        secret in "[ -~é€]{10,30}",
        raw in proptest::bool::ANY,
    ) {
        secrets_stay_hidden(&secret, raw);
    }
}

/// A case the property test once found: a password starting with `-`.
#[test]
fn a_secret_starting_with_a_hyphen_stays_hidden() {
    secrets_stay_hidden("-Aé€aa0é  ", false);
    secrets_stay_hidden("-Aé€aa0é  ", true);
}

/// See `no_debug_of_the_settings_holds_a_secret`.
fn secrets_stay_hidden(secret: &str, raw: bool) {
    use booking_expiration::libpq::url::percent_encode;
    let written = if raw {
        secret.to_owned()
    } else {
        percent_encode(secret)
    };
    let url = format!("postgres://app:{written}@db.example:5432/crm?sslmode=require");
    let direct = format!(
        "postgres://app@db.example/crm?password={}",
        percent_encode(secret)
    );
    let args = [
        "run",
        "--database-url",
        &url,
        "--database-direct-url",
        &direct,
        "--kafka-bootstrap-servers",
        "k:9092",
        "--kafka-sasl-mechanism",
        "SCRAM-SHA-512",
        "--kafka-sasl-username",
        "be",
        "--kafka-sasl-password",
        secret,
        "--pgpassword",
        secret,
    ];
    let forms = [secret.to_owned(), percent_encode(secret)];
    let hidden = |text: String| {
        for form in &forms {
            assert!(!text.contains(form.as_str()), "{text}");
        }
    };
    match parse(&args) {
        Ok(command) => {
            hidden(format!("{command:?}"));
            let Command::Run(run_args) = command else {
                panic!("not run");
            };
            match Settings::from_args(run_args) {
                Ok(settings) => hidden(format!("{settings:?}")),
                Err(error) => hidden(format!("{error} {error:?}")),
            }
        }
        Err(error) => {
            let config = ConfigError::from_clap(&error).expect("a setting error");
            hidden(format!("{config} {config:?}"));
        }
    }
    // A bad setting beside the secrets: the exit-2 line.
    let mut bad = args.to_vec();
    bad.extend(["--expiration-batch-size", "0"]);
    let error = parse(&bad).err().and_then(|e| ConfigError::from_clap(&e));
    if let Some(error) = error {
        hidden(format!("{error} {error:?}"));
    }
}
