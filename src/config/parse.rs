//! Value parsers: each turns the text of one setting into its type or says
//! what is wrong with it (never echoing a secret). [`setting`] makes one a
//! clap value parser whose error is a [`ConfigError`] naming the setting;
//! [`within`], [`within_or_off`] and [`count_within`] make one that also
//! keeps the value in its range ([`super::ranges`]) and names the range
//! in every refusal.

use std::{ffi::OsStr, fmt, net::SocketAddr, sync::Arc, time::Duration};

use clap::{Arg, builder::TypedValueParser};

use super::{Compression, ConfigError, Pooler, SaslMechanism, SecurityProtocol, ranges::Range};

/// What is wrong with a value, without the setting's name.
pub type Problem = String;

/// A clap value parser for one setting: a parse function, with its problem
/// turned into a [`ConfigError`] naming the setting's environment variable
/// (or its flag, for flags without one). `main` prints that error as the
/// one line of an exit 2; see [`ConfigError::from_clap`].
pub struct Setting<T>(Arc<Parse<T>>);

/// A parse function, with what it captured (a range, say).
type Parse<T> = dyn Fn(&str) -> Result<T, Problem> + Send + Sync;

/// See [`Setting`].
pub fn setting<T: 'static>(parse: fn(&str) -> Result<T, Problem>) -> Setting<T> {
    Setting(Arc::new(parse))
}

impl<T> Setting<T> {
    /// The value of `raw`, or its problem (without the setting's name).
    pub fn parse_text(&self, raw: &str) -> Result<T, Problem> {
        (self.0)(raw)
    }
}

impl<T> Clone for Setting<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> fmt::Debug for Setting<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Setting")
    }
}

impl<T: Clone + Send + Sync + 'static> TypedValueParser for Setting<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let (parse, name) = (Arc::clone(&self.0), setting_name(arg));
        // clap keeps the closure's error as the source of its own error.
        let named =
            move |raw: &str| parse(raw).map_err(|problem| ConfigError::new(name.clone(), problem));
        named.parse_ref(cmd, arg, value)
    }
}

/// A duration in `range`. Anything else, unreadable text included, is
/// refused with the range.
pub fn within(range: &'static Range<Duration>) -> Setting<Duration> {
    Setting(Arc::new(move |raw: &str| {
        let value = duration(raw).map_err(|_| {
            format!(
                "must be a duration from {} (like 500ms, 1s or 60s), got {raw:?}",
                range.text()
            )
        })?;
        range.check(value)
    }))
}

/// A duration in `range`, or `off` for none.
pub fn within_or_off(range: &'static Range<Duration>) -> Setting<Option<Duration>> {
    Setting(Arc::new(move |raw: &str| {
        if raw.trim() == "off" {
            return Ok(None);
        }
        let value = duration(raw).map_err(|_| {
            format!(
                "must be off or a duration from {} (like 500ms, 1s or 60s), got {raw:?}",
                range.text()
            )
        })?;
        range
            .check(value)
            .map(Some)
            .map_err(|problem| format!("{problem} (or off)"))
    }))
}

/// A whole number in `range`, as `T` (which must hold every number of the
/// range: the settings' tests parse each range's bounds).
pub fn count_within<T>(range: &'static Range<u64>) -> Setting<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
{
    Setting(Arc::new(move |raw: &str| {
        let value: i128 = raw
            .trim()
            .parse()
            .map_err(|_| format!("must be a whole number from {}, got {raw:?}", range.text()))?;
        let out_of_range = || format!("must be from {}, got {value}", range.text());
        let value = u64::try_from(value).map_err(|_| out_of_range())?;
        let value = range.check(value)?;
        T::try_from(value).map_err(|_| out_of_range())
    }))
}

/// A setting's id is its variable name (see the module docs of
/// [`crate::config`]); a flag without a variable is named by its flag.
fn setting_name(arg: Option<&Arg>) -> String {
    let Some(arg) = arg else {
        return "a setting".to_owned();
    };
    let id = arg.get_id().as_str();
    let is_variable = id
        .chars()
        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    match arg.get_long() {
        Some(long) if !is_variable => format!("--{long}"),
        _ => id.to_owned(),
    }
}

/// A humantime duration (`500ms`, `1s`, `60s`, `2m`), for [`within`].
fn duration(raw: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(raw.trim())
}

/// An on/off setting: `true`/`false` (also `on`/`off`, `yes`/`no`, `1`/`0`).
pub fn switch(raw: &str) -> Result<bool, Problem> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" | "1" => Ok(true),
        "false" | "off" | "no" | "0" => Ok(false),
        _ => Err(format!("{raw:?} is not true or false")),
    }
}

/// An RFC 3339 instant (`2026-12-01T00:00:00Z`).
pub fn instant(raw: &str) -> Result<chrono::DateTime<chrono::Utc>, Problem> {
    chrono::DateTime::parse_from_rfc3339(raw.trim())
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|_| format!("{raw:?} is not an RFC 3339 time (2026-12-01T00:00:00Z)"))
}

/// A number from 0 to 1.
pub fn fraction(raw: &str) -> Result<f64, Problem> {
    raw.trim()
        .parse()
        .ok()
        .filter(|f: &f64| (0.0..=1.0).contains(f))
        .ok_or_else(|| format!("{raw:?} is not between 0 and 1"))
}

/// `host:port` to listen on.
pub fn socket_addr(raw: &str) -> Result<SocketAddr, Problem> {
    raw.trim()
        .parse()
        .map_err(|_| format!("{raw:?} is not an address like 127.0.0.1:9464"))
}

/// A Kafka topic name: not empty, surrounding blanks dropped.
pub fn topic(raw: &str) -> Result<String, Problem> {
    match raw.trim() {
        "" => Err("is empty".to_owned()),
        topic => Ok(topic.to_owned()),
    }
}

/// `none` (or empty) or `transaction`: the pooler between the worker and
/// PostgreSQL, as far as it matters to the worker. A pooler in session mode
/// keeps each client on one server connection, so it is `none` here.
pub fn pooler(raw: &str) -> Result<Pooler, Problem> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "none" | "" | "session" => Ok(Pooler::None),
        "transaction" => Ok(Pooler::Transaction),
        other => Err(format!(
            "{other:?} is not none or transaction (a pooler in session mode is none)"
        )),
    }
}

/// The `host:port` servers of a comma-separated list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapServers(pub Vec<String>);

/// A comma-separated `host:port` list with at least one server.
pub fn bootstrap_servers(raw: &str) -> Result<BootstrapServers, Problem> {
    let servers = raw
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|server| match server.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0) => {
                Ok(server.to_owned())
            }
            _ => Err(format!("{server:?} is not host:port")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err("lists no server".to_owned());
    }
    Ok(BootstrapServers(servers))
}

/// `none` (or empty), `gzip`, `snappy`; `lz4`, `zstd` with their features.
pub fn compression(raw: &str) -> Result<Compression, Problem> {
    Ok(match raw.trim().to_ascii_lowercase().as_str() {
        "none" | "" => Compression::None,
        "gzip" => Compression::Gzip,
        "snappy" => Compression::Snappy,
        #[cfg(feature = "kafka-lz4")]
        "lz4" => Compression::Lz4,
        #[cfg(feature = "kafka-zstd")]
        "zstd" => Compression::Zstd,
        other => {
            return Err(format!(
                "{other:?} is not none, gzip or snappy (lz4/zstd need their build features)"
            ));
        }
    })
}

/// `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`; empty means no SASL, as
/// when the variable is unset.
pub fn sasl_mechanism(raw: &str) -> Result<Option<SaslMechanism>, Problem> {
    let mechanism = raw.trim();
    Ok(Some(match mechanism.to_ascii_uppercase().as_str() {
        "" => return Ok(None),
        "PLAIN" => SaslMechanism::Plain,
        "SCRAM-SHA-256" => SaslMechanism::ScramSha256,
        "SCRAM-SHA-512" => SaslMechanism::ScramSha512,
        _ => {
            return Err(format!(
                "{mechanism:?} is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
            ));
        }
    }))
}

/// Kafka's `security.protocol` names, in any case (as librdkafka takes
/// them); empty means unset.
pub fn security_protocol(raw: &str) -> Result<Option<SecurityProtocol>, Problem> {
    let protocol = raw.trim();
    Ok(Some(match protocol.to_ascii_uppercase().as_str() {
        "" => return Ok(None),
        "PLAINTEXT" => SecurityProtocol::Plaintext,
        "SSL" => SecurityProtocol::Ssl,
        "SASL_PLAINTEXT" => SecurityProtocol::SaslPlaintext,
        "SASL_SSL" => SecurityProtocol::SaslSsl,
        _ => {
            return Err(format!(
                "{protocol:?} is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
            ));
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::{super::ranges, *};

    #[test]
    fn counts_keep_their_range() {
        let batch = count_within::<u32>(&ranges::EXPIRATION_BATCH_SIZE);
        assert_eq!(batch.parse_text("200"), Ok(200));
        assert_eq!(batch.parse_text(" 100000 "), Ok(100_000));
        for (bad, problem) in [
            ("0", "must be from 1 to 100000, got 0"),
            ("-5", "must be from 1 to 100000, got -5"),
            ("100001", "must be from 1 to 100000, got 100001"),
            (
                "100000000000000000000000000",
                "must be from 1 to 100000, got 100000000000000000000000000",
            ),
            (
                "abc",
                "must be a whole number from 1 to 100000, got \"abc\"",
            ),
            ("", "must be a whole number from 1 to 100000, got \"\""),
            (
                "1.5",
                "must be a whole number from 1 to 100000, got \"1.5\"",
            ),
        ] {
            assert_eq!(batch.parse_text(bad), Err(problem.to_owned()), "{bad}");
        }
        let replicas = count_within::<i16>(&ranges::KAFKA_REPLICATION_FACTOR);
        assert_eq!(replicas.parse_text("32"), Ok(32_i16));
        let seed = count_within::<u64>(&ranges::SEED_POISON);
        assert_eq!(seed.parse_text("0"), Ok(0));
    }

    #[test]
    fn durations_keep_their_range() {
        let gap = within(&ranges::EXPIRATION_MIN_GAP);
        assert_eq!(gap.parse_text("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(gap.parse_text(" 1m "), Ok(Duration::from_secs(60)));
        for (bad, problem) in [
            ("0", "must be from 50ms to 60s, got 0s"),
            ("49ms", "must be from 50ms to 60s, got 49ms"),
            ("10000000d", "must be from 50ms to 60s, got 10000000d"),
            (
                "soon",
                "must be a duration from 50ms to 60s (like 500ms, 1s or 60s), got \"soon\"",
            ),
            (
                "-1s",
                "must be a duration from 50ms to 60s (like 500ms, 1s or 60s), got \"-1s\"",
            ),
            (
                "18446744073709551616s",
                "must be a duration from 50ms to 60s (like 500ms, 1s or 60s), \
                 got \"18446744073709551616s\"",
            ),
        ] {
            assert_eq!(gap.parse_text(bad), Err(problem.to_owned()), "{bad}");
        }
        let skew = within_or_off(&ranges::EXPIRATION_MAX_CLOCK_SKEW);
        assert_eq!(skew.parse_text(" off "), Ok(None));
        assert_eq!(skew.parse_text("2s"), Ok(Some(Duration::from_secs(2))));
        assert_eq!(skew.parse_text("0s"), Ok(Some(Duration::ZERO)));
        assert_eq!(
            skew.parse_text("10000000d"),
            Err("must be from 0s to 1h, got 10000000d (or off)".to_owned())
        );
        assert_eq!(
            skew.parse_text("never"),
            Err(
                "must be off or a duration from 0s to 1h (like 500ms, 1s or 60s), got \"never\""
                    .to_owned()
            )
        );
    }

    #[test]
    fn the_rest() {
        assert_eq!(switch("on"), Ok(true));
        assert!(switch("maybe").is_err());
        assert_eq!(fraction("1"), Ok(1.0));
        assert!(fraction("1.5").is_err());
        assert_eq!(topic("  "), Err("is empty".into()));
        assert_eq!(topic(" t "), Ok("t".into()));
        assert_eq!(
            bootstrap_servers("a:1, b:2,"),
            Ok(BootstrapServers(vec!["a:1".into(), "b:2".into()]))
        );
        for bad in ["localhost", ":9092", "h:0", "h:x"] {
            assert!(
                bootstrap_servers(bad)
                    .unwrap_err()
                    .contains("is not host:port")
            );
        }
        assert_eq!(bootstrap_servers(" , "), Err("lists no server".into()));
        assert_eq!(compression(""), Ok(Compression::None));
        assert_eq!(compression("GZIP"), Ok(Compression::Gzip));
        assert!(compression("brotli").is_err());
        assert_eq!(sasl_mechanism(""), Ok(None));
        assert_eq!(
            sasl_mechanism("scram-sha-512"),
            Ok(Some(SaslMechanism::ScramSha512))
        );
        assert!(sasl_mechanism("KERBEROS").is_err());
        assert_eq!(
            security_protocol("sasl_ssl"),
            Ok(Some(SecurityProtocol::SaslSsl))
        );
        assert_eq!(security_protocol(""), Ok(None));
        assert!(security_protocol("TLS").is_err());
    }
}
