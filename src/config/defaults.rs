//! Named, typed defaults of the settings (spec §9 and the operator
//! documentation). Each is shown in `--help` and goes through its
//! setting's own value parser like any other value, range included (the
//! command line's tests check that each one passes).

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    time::Duration,
};

use super::{Compression, Pooler, SecurityProtocol};

const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

pub const DATABASE_POOL_SIZE: u32 = 8;
pub const DATABASE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DATABASE_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// No pooler, or one in session mode: the worker's sessions are its own.
pub const DATABASE_POOLER: Pooler = Pooler::None;

pub const EXPIRATION_INTERVAL: Duration = Duration::from_secs(60);
pub const EXPIRATION_BATCH_SIZE: u32 = 200;
pub const EXPIRATION_MAX_BATCHES_PER_CYCLE: u32 = 1000;
pub const EXPIRATION_CYCLE_BUDGET: Duration = Duration::from_secs(30);
/// `None` would be `off`.
pub const EXPIRATION_MAX_CLOCK_SKEW: Option<Duration> = Some(Duration::from_secs(2));
pub const EXPIRATION_DEADLINE_WAKE: bool = true;
pub const EXPIRATION_MIN_GAP: Duration = Duration::from_millis(250);

/// The contract's topic, as the consumers' crate names it.
pub const KAFKA_TOPIC: &str = booking_expired_proto::TOPIC;
/// The `ce_source` header of the events.
pub const CE_SOURCE: &str = "/pin/crm/booking-expiration";

pub const OUTBOX_BATCH_SIZE: u32 = 500;
pub const OUTBOX_POLL_INTERVAL: Duration = Duration::from_secs(1);
pub const OUTBOX_RETENTION: Duration = Duration::from_secs(24 * HOUR);

pub const KAFKA_CLIENT_ID: &str = "booking-expiration";
pub const KAFKA_REQUEST_TIMEOUT: Duration = Duration::from_secs(35);
pub const KAFKA_TOPIC_PARTITIONS: i32 = 3;
pub const KAFKA_REPLICATION_FACTOR: i16 = 1;
pub const KAFKA_COMPRESSION: Compression = Compression::None;
/// Without a SASL mechanism; with one, an unset protocol is SASL_PLAINTEXT.
pub const KAFKA_SECURITY_PROTOCOL: SecurityProtocol = SecurityProtocol::Plaintext;

pub const METRICS_ADDR: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 9464));
pub const LIVENESS_WINDOW: Duration = Duration::from_secs(5 * MINUTE);

pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// `republish --batch-size`: expiry records per transaction.
pub const REPUBLISH_BATCH_SIZE: u32 = 500;

/// `seed --active`.
pub const SEED_ACTIVE: u64 = 10_000;
/// `seed --due-fraction`.
pub const SEED_DUE_FRACTION: f64 = 0.2;
/// `seed --inactive` and `seed --poison`.
pub const SEED_NONE: u64 = 0;
/// `seed --spread`.
pub const SEED_SPREAD: Duration = Duration::from_secs(10 * MINUTE);

/// A default written the way an operator writes the value, for `--help`
/// and for clap, which parses it back with the setting's value parser.
pub trait AsText {
    fn as_text(&self) -> String;
}

impl AsText for Duration {
    /// `500ms`, `30s`, `60s`, `5m`, `24h`, `12d`: the forms the operator
    /// documentation uses (one minute stays `60s` and one day `24h`, as
    /// documented).
    fn as_text(&self) -> String {
        let secs = self.as_secs();
        if self.subsec_nanos() != 0 {
            if self.subsec_nanos().is_multiple_of(1_000_000) {
                format!("{}ms", self.as_millis())
            } else {
                humantime::format_duration(*self).to_string()
            }
        } else if secs > DAY && secs.is_multiple_of(DAY) {
            format!("{}d", secs / DAY)
        } else if secs > 0 && secs.is_multiple_of(HOUR) {
            format!("{}h", secs / HOUR)
        } else if secs > MINUTE && secs.is_multiple_of(MINUTE) {
            format!("{}m", secs / MINUTE)
        } else {
            format!("{secs}s")
        }
    }
}

/// A skew limit: `off` when there is none.
impl AsText for Option<Duration> {
    fn as_text(&self) -> String {
        self.as_ref()
            .map_or_else(|| "off".to_owned(), AsText::as_text)
    }
}

macro_rules! as_text_by_display {
    ($($ty:ty),*) => {
        $(impl AsText for $ty {
            fn as_text(&self) -> String {
                self.to_string()
            }
        })*
    };
}
as_text_by_display!(
    u32,
    u64,
    i32,
    i16,
    f64,
    bool,
    SocketAddr,
    Compression,
    Pooler,
    SecurityProtocol
);

/// The `&'static str` clap takes as a default, made once from a typed
/// default: `default_value = text!(defaults::EXPIRATION_INTERVAL)`.
macro_rules! text {
    ($value:expr) => {{
        static TEXT: ::std::sync::OnceLock<String> = ::std::sync::OnceLock::new();
        TEXT.get_or_init(|| $crate::config::defaults::AsText::as_text(&$value))
            .as_str()
    }};
}
pub(crate) use text;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_read_as_the_operator_documentation_writes_them() {
        let texts = [
            (EXPIRATION_INTERVAL.as_text(), "60s"),
            (EXPIRATION_MAX_CLOCK_SKEW.as_text(), "2s"),
            (EXPIRATION_DEADLINE_WAKE.as_text(), "true"),
            (EXPIRATION_MIN_GAP.as_text(), "250ms"),
            (None::<Duration>.as_text(), "off"),
            (OUTBOX_RETENTION.as_text(), "24h"),
            (LIVENESS_WINDOW.as_text(), "5m"),
            (Duration::from_millis(500).as_text(), "500ms"),
            (Duration::ZERO.as_text(), "0s"),
            (Duration::from_secs(86_400).as_text(), "24h"),
            (Duration::from_secs(12 * 86_400).as_text(), "12d"),
            (METRICS_ADDR.as_text(), "127.0.0.1:9464"),
            (KAFKA_COMPRESSION.as_text(), "none"),
            (DATABASE_POOLER.as_text(), "none"),
            (KAFKA_SECURITY_PROTOCOL.as_text(), "PLAINTEXT"),
            (SEED_DUE_FRACTION.as_text(), "0.2"),
        ];
        for (text, documented) in texts {
            assert_eq!(text, documented);
        }
    }
}
