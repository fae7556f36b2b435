//! tracing setup: human-readable on a terminal, JSON with `LOG_FORMAT=json`,
//! level from `RUST_LOG` (default `info`). Logs go to stderr so stdout stays
//! clean for `once`'s JSON line. Spans also become OpenTelemetry spans
//! ([`super::trace`]).
//!
//! What a line costs does not depend on the work: spans carry ids and
//! counts, never lists, and each span field is recorded once, so a line
//! stays a few hundred bytes whatever the batch or the number of tenants
//! (`tests/it/logging.rs`). Lines wait in a buffer and reach stderr in
//! blocks ([`LogBuffer`]): one write per block, not one per line.

use std::{
    io::{BufWriter, IsTerminal, Write},
    sync::{LazyLock, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::{
    EnvFilter,
    filter::{FilterExt as _, Targets, filter_fn},
    fmt,
    fmt::MakeWriter,
    prelude::*,
};

use super::trace::{self, TraceEnv, TraceGuard, TraceSetupError};

/// The log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// `LOG_FORMAT`: `json` or `text` (any case; unset or empty is text),
    /// or why not.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value.map(str::trim).unwrap_or_default() {
            "" => Ok(Self::Text),
            json if json.eq_ignore_ascii_case("json") => Ok(Self::Json),
            text if text.eq_ignore_ascii_case("text") => Ok(Self::Text),
            other => Err(format!("{other:?} is not text or json")),
        }
    }

    /// `LOG_FORMAT` as [`Self::parse`] reads it, text when it cannot (the
    /// benchmarks; the binary refuses it: [`init`]).
    pub fn from_env() -> Self {
        Self::parse(std::env::var("LOG_FORMAT").ok().as_deref()).unwrap_or(Self::Text)
    }
}

/// Why logging could not be set up: a setting it reads is malformed (the
/// line of an exit 2, naming it), or the trace's own setup failed.
#[derive(Debug, thiserror::Error)]
pub enum LogSetupError {
    #[error("{name}: {problem}")]
    Setting { name: &'static str, problem: String },
    #[error(transparent)]
    Trace(#[from] TraceSetupError),
}

/// The log buffer's size: about 180 lines of a few hundred bytes.
pub const BUFFER_BYTES: usize = 64 * 1024;
/// The longest a line waits in the buffer while the process runs.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);

type Target = BufWriter<Box<dyn Write + Send>>;

/// Where log lines go (stderr unless [`install`] was given another file),
/// through one buffer.
static TARGET: LazyLock<Mutex<Target>> = LazyLock::new(|| {
    Mutex::new(BufWriter::with_capacity(
        BUFFER_BYTES,
        Box::new(std::io::stderr()),
    ))
});

fn target() -> MutexGuard<'static, Target> {
    TARGET.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The log lines' writer: a line goes into the buffer whole, and the buffer
/// is written out when full, every [`FLUSH_EVERY`] (a thread [`install`]
/// starts), before a panic's message, and by [`flush`] when the command
/// ends. With a `booking expired` line per booking, a write per line cost
/// up to a fifth of the cycle (benchmark figure 16); a block of lines costs
/// one. A `kill -9` loses at most the last [`FLUSH_EVERY`] of lines.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogBuffer;

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        target().write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        target().write_all(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // The flusher's job: a flush per line is what the buffer avoids.
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

/// Writes what waits in the log buffer out now.
pub fn flush() {
    let _ = target().flush();
}

/// One line on stderr after the log lines written before it (the command's
/// own messages: errors, `republish` progress).
pub fn stderr_line(line: &str) {
    let mut target = target();
    let _ = writeln!(target, "{line}").and_then(|()| target.flush());
}

/// Installs the global subscriber, writing to stderr. Call once, in `main`,
/// before the async runtime starts; keep the guard until the command ended
/// (dropping it flushes the spans still queued for export), and call
/// [`flush`] before the process exits.
pub fn init() -> Result<TraceGuard, LogSetupError> {
    // Checked before anything is installed: a setting nobody reads
    // correctly is refused as any other is, not replaced by a default.
    let format =
        LogFormat::parse(std::env::var("LOG_FORMAT").ok().as_deref()).map_err(|problem| {
            LogSetupError::Setting {
                name: "LOG_FORMAT",
                problem,
            }
        })?;
    let filter = log_filter(std::env::var("RUST_LOG").ok().as_deref()).map_err(|problem| {
        LogSetupError::Setting {
            name: "RUST_LOG",
            problem,
        }
    })?;
    let trace_env = TraceEnv::from_lookup(|name| std::env::var(name).ok())?;
    let (provider, guard) = trace::provider(&trace_env)?;
    install_with(
        &provider,
        format,
        filter,
        Box::new(std::io::stderr()),
        std::io::stderr().is_terminal(),
    );
    let panic_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // Not while this thread holds the buffer (a panic inside a write).
        if let Ok(mut target) = TARGET.try_lock() {
            let _ = target.flush();
        }
        panic_hook(info);
    }));
    Ok(guard)
}

/// The log filter of `RUST_LOG` (`info` when unset or empty), or why it
/// does not parse; rskafka's own lines are off unless `RUST_LOG` names
/// rskafka: the publisher classifies and reports every Kafka error itself,
/// once a minute per partition while it lasts, while rskafka writes an
/// ERROR line for every refused request (an authorization failure: one per
/// try, 40 a minute).
pub fn log_filter(rust_log: Option<&str>) -> Result<EnvFilter, String> {
    let directives = rust_log.filter(|d| !d.trim().is_empty()).unwrap_or("info");
    let filter = EnvFilter::builder()
        .parse(directives)
        .map_err(|error| format!("{directives:?} is not a log filter ({error})"))?;
    if directives.contains("rskafka") {
        return Ok(filter);
    }
    Ok(match "rskafka=off".parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    })
}

/// Installs the binary's subscriber (trace layer, `RUST_LOG` filter,
/// `format`) writing the log lines through the buffer to `output`: the
/// benchmarks pass a file, so they measure what the binary costs (an
/// unreadable `RUST_LOG` is `info` there; [`init`] refuses it).
pub fn install(
    provider: &SdkTracerProvider,
    format: LogFormat,
    output: Box<dyn Write + Send>,
    ansi: bool,
) {
    let filter = log_filter(std::env::var("RUST_LOG").ok().as_deref())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    install_with(provider, format, filter, output, ansi);
}

/// [`install`] with the filter made. Starts the thread that empties the
/// buffer every [`FLUSH_EVERY`].
fn install_with(
    provider: &SdkTracerProvider,
    format: LogFormat,
    filter: EnvFilter,
    output: Box<dyn Write + Send>,
    ansi: bool,
) {
    {
        let mut target = target();
        let _ = target.flush();
        *target = BufWriter::with_capacity(BUFFER_BYTES, output);
    }
    let _ = std::thread::Builder::new()
        .name("log-flush".into())
        .spawn(|| {
            loop {
                std::thread::sleep(FLUSH_EVERY);
                flush();
            }
        });
    let writer = LogBuffer;
    // RUST_LOG filters the logs only: the worker's spans (info level) are
    // traced whatever the log level, so RUST_LOG=warn keeps the trace.
    // The trace takes the spans and, as span events, only warnings and
    // errors: a `booking expired` event per booking on the cycle span would
    // grow the span with the cycle.
    let traced = Targets::new()
        .with_target(env!("CARGO_CRATE_NAME"), Level::INFO)
        .and(filter_fn(|meta| {
            meta.is_span() || *meta.level() <= Level::WARN
        }));
    let registry = tracing_subscriber::registry().with(trace::layer(provider).with_filter(traced));
    match format {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(writer)
                    .with_filter(filter),
            )
            .init(),
        LogFormat::Text => registry
            .with(
                fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(writer)
                    .with_filter(filter),
            )
            .init(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// The lines `filter` lets through for one rskafka error and one of
    /// the worker's own warnings.
    fn lines_through(filter: EnvFilter) -> String {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let writer = {
            let out = Arc::clone(&out);
            move || Capture(Arc::clone(&out))
        };
        let subscriber = tracing_subscriber::registry().with(
            fmt::layer()
                .with_ansi(false)
                .with_writer(writer)
                .with_filter(filter),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "rskafka::client::partition", "request encountered fatal error");
            tracing::warn!("partition cannot be written");
        });
        let text = out.lock().map(|b| String::from_utf8_lossy(&b).into_owned());
        text.unwrap_or_default()
    }

    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut out) = self.0.lock() {
                out.extend_from_slice(buf);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn rskafkas_own_lines_are_off_unless_rust_log_names_it() {
        for default in [None, Some(""), Some("info"), Some("debug"), Some("warn")] {
            let lines = lines_through(log_filter(default).unwrap());
            assert!(!lines.contains("fatal error"), "{default:?}: {lines}");
            assert!(lines.contains("cannot be written"), "{default:?}: {lines}");
        }
        let named = lines_through(log_filter(Some("info,rskafka=error")).unwrap());
        assert!(named.contains("fatal error"), "{named}");
    }

    /// A setting that does not parse is refused (the binary exits 2 naming
    /// it), never replaced by a default.
    #[test]
    fn an_unreadable_rust_log_or_log_format_is_refused() {
        for bad in ["=^=", "booking_expiration=[", "warn,foo=bar=baz"] {
            let problem = log_filter(Some(bad)).unwrap_err();
            assert!(problem.contains("is not a log filter"), "{bad}: {problem}");
        }
        assert_eq!(LogFormat::parse(None), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse(Some(" ")), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse(Some("JSON")), Ok(LogFormat::Json));
        assert_eq!(LogFormat::parse(Some("text")), Ok(LogFormat::Text));
        assert_eq!(
            LogFormat::parse(Some("jsn")),
            Err("\"jsn\" is not text or json".to_owned())
        );
    }
}
