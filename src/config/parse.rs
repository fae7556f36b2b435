//! Value parsers: each turns the text of one setting into its type or says
//! what is wrong with it (never echoing a secret). [`super::setting`]
//! names the setting in the refusal; durations and counts are read there,
//! within their ranges.

use std::{net::SocketAddr, path::PathBuf};

use super::{Compression, Pooler, SaslMechanism, SecurityProtocol};
use crate::libpq::url::PgUrl;

/// What is wrong with a value, without the setting's name.
pub type Problem = String;

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

/// A PostgreSQL URL's grammar (libpq's, [`PgUrl::parse`]): what it means,
/// its TLS parameters included, is settled with libpq's environment
/// ([`super::DatabaseArgs::settings`]).
pub fn pg_url(raw: &str) -> Result<PgUrl, Problem> {
    PgUrl::parse(raw).map_err(|error| error.to_string())
}

/// Any text (an empty variable of libpq's is unset: libpq's rules say so).
pub fn text(raw: &str) -> Result<String, Problem> {
    Ok(raw.to_owned())
}

/// A file's path, as given.
pub fn path(raw: &str) -> Result<PathBuf, Problem> {
    Ok(PathBuf::from(raw))
}

/// The `host:port` servers of a comma-separated list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapServers(pub Vec<String>);

/// A comma-separated `host:port` list with at least one server and no
/// empty entry: `a:9092,,b:9092` or a trailing comma is a list written
/// wrong (a variable that expanded to nothing, say), not one to guess at.
pub fn bootstrap_servers(raw: &str) -> Result<BootstrapServers, Problem> {
    let entries: Vec<&str> = raw.split(',').map(str::trim).collect();
    if entries.iter().all(|entry| entry.is_empty()) {
        return Err("lists no server".to_owned());
    }
    if entries.iter().any(|entry| entry.is_empty()) {
        return Err(format!(
            "{raw:?} has an empty entry (two commas in a row, or one at an end)"
        ));
    }
    let servers = entries
        .into_iter()
        .map(|server| match server.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0) => {
                Ok(server.to_owned())
            }
            _ => Err(format!("{server:?} is not host:port")),
        })
        .collect::<Result<Vec<_>, _>>()?;
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
    use super::*;

    #[test]
    fn the_rest() {
        assert_eq!(switch("on"), Ok(true));
        assert!(switch("maybe").is_err());
        assert_eq!(fraction("1"), Ok(1.0));
        assert!(fraction("1.5").is_err());
        assert_eq!(topic("  "), Err("is empty".into()));
        assert_eq!(topic(" t "), Ok("t".into()));
        assert_eq!(
            bootstrap_servers("a:1, b:2"),
            Ok(BootstrapServers(vec!["a:1".into(), "b:2".into()]))
        );
        for empty in ["a:1,,b:2", "a:1, b:2,", ",a:1", "a:1, ,b:2"] {
            assert!(
                bootstrap_servers(empty)
                    .unwrap_err()
                    .contains("has an empty entry"),
                "{empty}"
            );
        }
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
