//! tracing setup: human-readable on a terminal, JSON with `LOG_FORMAT=json`,
//! level from `RUST_LOG` (default `info`). Logs go to stderr so stdout stays
//! clean for `once`'s JSON line. Spans also become OpenTelemetry spans
//! ([`super::trace`]).
//!
//! What a line costs does not depend on the work: spans carry ids and
//! counts, never lists, and each span field is recorded once, so a line
//! stays a few hundred bytes whatever the batch or the number of tenants
//! (`tests/it/logging.rs`).

use std::io::IsTerminal;

use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::{EnvFilter, filter::Targets, fmt, fmt::MakeWriter, prelude::*};

use super::trace::{self, TraceEnv, TraceGuard, TraceSetupError};

/// The log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// `LOG_FORMAT=json` (any case) is JSON; anything else is text.
    pub fn from_env() -> Self {
        if std::env::var("LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json")) {
            Self::Json
        } else {
            Self::Text
        }
    }
}

/// Installs the global subscriber. Call once, in `main`, before the async
/// runtime starts; keep the guard until the command ended (dropping it
/// flushes the spans still queued for export).
pub fn init() -> Result<TraceGuard, TraceSetupError> {
    let trace_env = TraceEnv::from_lookup(|name| std::env::var(name).ok())?;
    let (provider, guard) = trace::provider(&trace_env)?;
    install(
        &provider,
        LogFormat::from_env(),
        std::io::stderr,
        std::io::stderr().is_terminal(),
    );
    Ok(guard)
}

/// Installs the binary's subscriber (trace layer, `RUST_LOG` filter,
/// `format`) writing the log lines to `writer`: `main` passes stderr, the
/// benchmarks a file, so they measure what the binary costs.
pub fn install<W>(provider: &SdkTracerProvider, format: LogFormat, writer: W, ansi: bool)
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    // RUST_LOG filters the logs only: the worker's spans (info level) are
    // traced whatever the log level, so RUST_LOG=warn keeps the trace.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let spans = Targets::new().with_target(env!("CARGO_CRATE_NAME"), Level::INFO);
    let registry = tracing_subscriber::registry().with(trace::layer(provider).with_filter(spans));
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
