//! tracing setup: human-readable on a terminal, JSON with `LOG_FORMAT=json`,
//! level from `RUST_LOG` (default `info`). Logs go to stderr so stdout stays
//! clean for `once`'s JSON line. Spans also become OpenTelemetry spans
//! ([`super::trace`]).

use std::io::IsTerminal;

use tracing::Level;
use tracing_subscriber::{EnvFilter, filter::Targets, fmt, prelude::*};

use super::trace::{self, TraceEnv, TraceGuard, TraceSetupError};

/// Installs the global subscriber. Call once, in `main`, before the async
/// runtime starts; keep the guard until the command ended (dropping it
/// flushes the spans still queued for export).
pub fn init() -> Result<TraceGuard, TraceSetupError> {
    let trace_env = TraceEnv::from_lookup(|name| std::env::var(name).ok())?;
    let (provider, guard) = trace::provider(&trace_env)?;
    // RUST_LOG filters the logs only: the worker's spans (info level) are
    // traced whatever the log level, so RUST_LOG=warn keeps the trace.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let spans = Targets::new().with_target(env!("CARGO_CRATE_NAME"), Level::INFO);
    let json = std::env::var("LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let registry = tracing_subscriber::registry().with(trace::layer(&provider).with_filter(spans));
    if json {
        registry
            .with(
                fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(std::io::stderr)
                    .with_filter(filter),
            )
            .init();
    } else {
        registry
            .with(
                fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr)
                    .with_filter(filter),
            )
            .init();
    }
    Ok(guard)
}
