//! A real OpenTelemetry Collector (built by scripts/otelcol.sh, path in
//! `OTELCOL_BIN`) with an OTLP/HTTP receiver and a file exporter: what the
//! binary exports, as the collector wrote it (one OTLP JSON document a
//! line).

use std::{path::PathBuf, time::Duration};

use super::{Running, free_port, tempdir};

pub struct Collector {
    /// `host:port` of the OTLP/HTTP receiver.
    pub endpoint: String,
    /// The file exporter's output.
    pub spans_file: PathBuf,
    running: Running,
}

impl Collector {
    /// Starts one and waits until it listens.
    pub async fn start() -> Self {
        let collector_bin = std::env::var("OTELCOL_BIN")
            .expect("OTELCOL_BIN: run the tests with scripts/test.sh, which builds the collector");
        let dir = tempdir("otelcol");
        let port = free_port();
        let spans_file = dir.join("spans.jsonl");
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
                 exporters:\n  file:\n    path: {}\n    flush_interval: 100ms\n\
                 service:\n  telemetry:\n    metrics:\n      level: none\n\
                 \x20 pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n",
                spans_file.display()
            ),
        )
        .expect("write the collector's configuration");
        let mut command = std::process::Command::new(&collector_bin);
        command.arg(format!("--config=file:{}", config.display()));
        let mut running = Running::spawn(command);
        let endpoint = format!("127.0.0.1:{port}");
        let listening = tokio::time::timeout(Duration::from_secs(30), async {
            while tokio::net::TcpStream::connect(&endpoint).await.is_err() {
                if running.child.try_wait().ok().flatten().is_some() {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            true
        })
        .await;
        assert!(
            matches!(listening, Ok(true)),
            "the collector does not listen: {}",
            running.stderr()
        );
        Self {
            endpoint,
            spans_file,
            running,
        }
    }

    /// Everything exported so far, as written.
    pub fn exported(&self) -> String {
        std::fs::read_to_string(&self.spans_file).unwrap_or_default()
    }

    pub async fn stop(mut self) {
        self.running.terminate();
        let _ = self.running.wait(Duration::from_secs(30)).await;
    }
}
