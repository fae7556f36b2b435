//! Traces: every span of the `tracing` tree also becomes an OpenTelemetry
//! span, exported over OTLP (HTTP + protobuf, plain HTTP: no TLS stack in
//! the build) when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set. The SDK reads the other
//! standard variables itself (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER[_ARG]`, `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`,
//! `…_TIMEOUT`, `OTEL_BSP_*`).
//!
//! Without those variables the ids are still generated here, so every
//! outbox row carries a W3C `traceparent` naming the cycle's trace.

use opentelemetry::trace::{SpanContext, TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::{Resource, trace::SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::events::TraceHeaders;

/// The service name when neither `OTEL_SERVICE_NAME` nor a `service.name`
/// in `OTEL_RESOURCE_ATTRIBUTES` names one.
pub const DEFAULT_SERVICE_NAME: &str = "booking-expiration";

/// The one OTLP protocol this build speaks.
pub const OTLP_PROTOCOL: &str = "http/protobuf";

/// A standard `OTEL_*` variable this build cannot honour.
#[derive(Debug, thiserror::Error)]
pub enum TraceSetupError {
    #[error("{name}: only {OTLP_PROTOCOL} is supported (got {value})")]
    Protocol { name: &'static str, value: String },
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
}

/// What the environment asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEnv {
    /// Export spans (an OTLP endpoint is set and the SDK is not disabled).
    pub export: bool,
    /// Set the default service name (none named by the environment).
    pub default_service_name: bool,
}

impl TraceEnv {
    /// Reads the variables through `var` (the process environment in `main`).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self, TraceSetupError> {
        let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
        for name in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ] {
            if let Some(value) = var(name).filter(|v| !v.trim().is_empty())
                && value.trim() != OTLP_PROTOCOL
            {
                return Err(TraceSetupError::Protocol { name, value });
            }
        }
        let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim() == "true")
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim() == "none");
        let endpoint =
            set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let named = set("OTEL_SERVICE_NAME")
            || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attributes| {
                attributes
                    .split(',')
                    .any(|kv| kv.trim_start().starts_with("service.name="))
            });
        Ok(Self {
            export: endpoint && !disabled,
            default_service_name: !named,
        })
    }
}

/// Keeps the tracer provider; dropping it flushes and stops the exporter.
#[derive(Debug)]
pub struct TraceGuard {
    provider: SdkTracerProvider,
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        // Flushes the batch of spans still queued; errors are the SDK's to log.
        let _ = self.provider.shutdown();
    }
}

/// Builds the tracer provider: OTLP export when `env.export`, local ids only
/// otherwise. Call outside the async runtime (the HTTP client is blocking
/// and runs on the SDK's own export thread).
pub fn provider(env: &TraceEnv) -> Result<(SdkTracerProvider, TraceGuard), TraceSetupError> {
    let mut resource = Resource::builder();
    if env.default_service_name {
        resource = resource.with_service_name(DEFAULT_SERVICE_NAME);
    }
    let mut builder = SdkTracerProvider::builder().with_resource(resource.build());
    if env.export {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|e| TraceSetupError::Exporter(e.to_string()))?;
        builder = builder.with_batch_exporter(exporter);
    }
    let provider = builder.build();
    Ok((
        provider.clone(),
        TraceGuard {
            provider: provider.clone(),
        },
    ))
}

/// The `tracing` layer that turns spans into OpenTelemetry spans.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S> + use<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("booking-expiration"))
}

/// The W3C trace context of `span`: its OpenTelemetry span when the layer
/// is installed, otherwise fresh local ids (library use without `main`).
pub fn headers_of(span: &tracing::Span) -> TraceHeaders {
    let context = span.context();
    let span_ref = context.span();
    let span_context = span_ref.span_context();
    if span_context.is_valid() {
        return from_span_context(span_context);
    }
    let trace_id = loop {
        let id = fastrand::u128(..);
        if id != 0 {
            break id;
        }
    };
    let span_id = loop {
        let id = fastrand::u64(..);
        if id != 0 {
            break id;
        }
    };
    TraceHeaders {
        traceparent: Some(format!("00-{trace_id:032x}-{span_id:016x}-01")),
        tracestate: None,
    }
}

fn from_span_context(span_context: &SpanContext) -> TraceHeaders {
    let flags = if span_context.is_sampled() { 1 } else { 0 };
    let state = span_context.trace_state().header();
    TraceHeaders {
        traceparent: Some(format!(
            "00-{}-{}-{flags:02x}",
            span_context.trace_id(),
            span_context.span_id()
        )),
        tracestate: (!state.is_empty()).then_some(state),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<TraceEnv, TraceSetupError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        TraceEnv::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn exports_only_with_an_endpoint() {
        let none = env(&[]).unwrap();
        assert!(!none.export);
        assert!(none.default_service_name);
        assert!(
            env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")])
                .unwrap()
                .export
        );
        assert!(
            env(&[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://127.0.0.1:4318/v1/traces"
            )])
            .unwrap()
            .export
        );
        assert!(
            !env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_SDK_DISABLED", "true")
            ])
            .unwrap()
            .export
        );
        assert!(
            !env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_TRACES_EXPORTER", "none")
            ])
            .unwrap()
            .export
        );
    }

    #[test]
    fn only_http_protobuf_is_accepted() {
        assert!(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).is_ok());
        let error = env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf is supported (got grpc)"
        );
        assert!(env(&[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")]).is_err());
    }

    #[test]
    fn service_name_from_the_environment_wins() {
        assert!(
            !env(&[("OTEL_SERVICE_NAME", "x")])
                .unwrap()
                .default_service_name
        );
        assert!(
            !env(&[("OTEL_RESOURCE_ATTRIBUTES", "a=b, service.name=x")])
                .unwrap()
                .default_service_name
        );
        assert_eq!(DEFAULT_SERVICE_NAME, "booking-expiration");
    }

    #[test]
    fn local_ids_without_the_layer() {
        let headers = headers_of(&tracing::Span::none());
        let traceparent = headers.traceparent.unwrap();
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(parts.len(), 4, "{traceparent}");
        assert_eq!(parts[0], "00");
        assert_eq!(parts[1].len(), 32);
        assert_eq!(parts[2].len(), 16);
        assert_eq!(parts[3], "01");
        assert!(headers.tracestate.is_none());
    }

    #[test]
    fn layer_ids_name_the_span() {
        use tracing_subscriber::prelude::*;
        let (provider, _guard) = provider(&TraceEnv {
            export: false,
            default_service_name: true,
        })
        .unwrap();
        let subscriber = tracing_subscriber::registry().with(layer(&provider));
        tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!("cycle");
            let _entered = outer.enter();
            let inner = tracing::info_span!("batch");
            let a = headers_of(&outer).traceparent.unwrap();
            let b = headers_of(&inner).traceparent.unwrap();
            assert_eq!(a[3..35], b[3..35], "one trace: {a} / {b}");
            assert_ne!(a[36..52], b[36..52], "two spans");
            assert!(a.ends_with("-01"));
        });
    }
}
