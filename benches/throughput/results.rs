//! Everything one run measured, as one typed value: written to
//! `results.json` at the end of a run, and read back from it to render the
//! tables again (`BENCH_RENDER_ONLY`). A run limited by `BENCH_ONLY` keeps
//! the figures it did not measure from the `results.json` it replaces
//! ([`Results::merged_over`]); `measured` says which run measured what.

use std::{collections::BTreeMap, path::Path};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::figures::{
    deadline_wake::{DeadlineToKafka, LateArrivals, Lateness, Statements},
    drain::DrainFigure,
    end_to_end::{Binary, EndToEnd},
    expiry::Comparison,
    idle::IdleCycle,
    kafka_tls::KafkaTlsFigure,
    migrations::MigrationsFigure,
    outbox_cost::OutboxCost,
    profile::ProfileRun,
    publisher::PublisherFigure,
    replay::ReplayFigure,
    schema_cost::{LeanFigure, SchemaCost},
    sustained::Sustained,
};

/// The figures `BENCH_ONLY` names, in the order a full run measures them.
pub const FIGURES: [&str; 19] = [
    "expiry",
    "logging",
    "lean",
    "schema_cost",
    "idle",
    "publisher",
    "outbox_cost",
    "end_to_end",
    "scaling",
    "replay",
    "migrations",
    "lateness",
    "deadline_to_kafka",
    "sustained",
    "drain",
    "statements",
    "late_arrivals",
    "profile",
    "kafka_tls",
];

/// One run of the bench (the shape of `results.json`). A figure this run
/// did not measure and no earlier run left is absent.
#[derive(Debug, Serialize, Deserialize)]
pub struct Results {
    /// The command that ran, for the reader of the file.
    pub command: String,
    /// `full` or `quick`.
    pub mode: String,
    /// RFC 3339.
    pub finished_at: String,
    pub duration_s: f64,
    pub machine: Machine,
    /// `current_setting` of the cluster, by name.
    pub postgresql: BTreeMap<String, String>,
    /// Which run measured each figure (by `BENCH_ONLY` name); absent in
    /// files written before `BENCH_ONLY`: then the file's own run.
    #[serde(default)]
    pub measured: BTreeMap<String, Stamp>,
    /// Figures 1 and 2, by key (`figures::expiry::configs` gives their order).
    #[serde(default)]
    pub expiry: BTreeMap<String, Comparison>,
    /// Figure 10: the worker against the raw statement on its own and on a
    /// lean schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lean: Option<LeanFigure>,
    /// Figure 11: what each index, constraint, type and trigger costs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_cost: Option<SchemaCost>,
    /// Figure 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_cycle: Option<IdleCycle>,
    /// Figure 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher: Option<PublisherFigure>,
    /// Figure 17: PostgreSQL's CPU and WAL per event, the publisher
    /// before and after the pipeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbox_cost: Option<OutboxCost>,
    /// Figures 5 and 6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_to_end: Option<EndToEnd>,
    pub binary: Binary,
    /// Figure 7: lateness, deadline-driven versus fixed schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lateness: Option<Lateness>,
    /// Figure 8: deadline → record on Kafka.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_to_kafka: Option<DeadlineToKafka>,
    /// Figure 18: bookings falling due at steps of rate, 1 and 4 instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sustained: Option<Sustained>,
    /// Figure 9: statements per minute, 1 and 4 instances, both modes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statements: Option<Statements>,
    /// Figure 10: Kafka over SASL_SSL against PLAINTEXT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_tls: Option<KafkaTlsFigure>,
    /// Figure 19: an outbox backlog drained at three sizes.
    #[serde(default)]
    pub drain: Option<DrainFigure>,
    /// Figure 13: `republish` over a year of audit trail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayFigure>,
    /// Figure 14: the migrations that lock the outbox, on a 24 h outbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrations: Option<MigrationsFigure>,
    /// Figure 15: bookings written while the worker sleeps; idle statements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_arrivals: Option<LateArrivals>,
    /// Figure 16: the default logging against `RUST_LOG=warn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logging: Option<crate::figures::logging::LoggingFigure>,
    /// The profile pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_pg_stat_statements: Option<Vec<ProfileRun>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub loadavg_at_start: [f64; 3],
    /// Also the load shown for the binary's size, measured last.
    pub loadavg_at_end: [f64; 3],
}

/// The run that measured a figure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// RFC 3339, the run's `finished_at`.
    pub finished_at: String,
    /// `full` or `quick`.
    pub mode: String,
}

impl Results {
    pub fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("write {}", path.display()))
    }

    /// The figures (`BENCH_ONLY` names) this value holds.
    pub fn present(&self) -> Vec<&'static str> {
        let headline = crate::figures::expiry::HEADLINE.key;
        let has = |name: &str| match name {
            "expiry" => self.expiry.contains_key(headline),
            "scaling" => self.expiry.keys().any(|k| k != headline),
            "lean" => self.lean.is_some(),
            "schema_cost" => self.schema_cost.is_some(),
            "idle" => self.idle_cycle.is_some(),
            "publisher" => self.publisher.is_some(),
            "outbox_cost" => self.outbox_cost.is_some(),
            "sustained" => self.sustained.is_some(),
            "end_to_end" => self.end_to_end.is_some(),
            "lateness" => self.lateness.is_some(),
            "deadline_to_kafka" => self.deadline_to_kafka.is_some(),
            "statements" => self.statements.is_some(),
            "profile" => self.profile_pg_stat_statements.is_some(),
            "kafka_tls" => self.kafka_tls.is_some(),
            "drain" => self.drain.is_some(),
            "replay" => self.replay.is_some(),
            "migrations" => self.migrations.is_some(),
            "late_arrivals" => self.late_arrivals.is_some(),
            "logging" => self.logging.is_some(),
            _ => false,
        };
        FIGURES.into_iter().filter(|f| has(f)).collect()
    }

    /// This run's figures over `previous`'s: what this run measured
    /// replaces, what it did not is kept (expiry figures by key), each
    /// figure keeping the stamp of the run that measured it.
    pub fn merged_over(mut self, mut previous: Results) -> Results {
        if previous.measured.is_empty() {
            let stamp = Stamp {
                finished_at: previous.finished_at.clone(),
                mode: previous.mode.clone(),
            };
            for figure in previous.present() {
                previous.measured.insert(figure.into(), stamp.clone());
            }
        }
        previous.measured.append(&mut self.measured);
        self.measured = previous.measured;
        previous.expiry.append(&mut self.expiry);
        self.expiry = previous.expiry;
        self.lean = self.lean.or(previous.lean);
        self.schema_cost = self.schema_cost.or(previous.schema_cost);
        self.idle_cycle = self.idle_cycle.or(previous.idle_cycle);
        self.publisher = self.publisher.or(previous.publisher);
        self.outbox_cost = self.outbox_cost.or(previous.outbox_cost);
        self.sustained = self.sustained.or(previous.sustained);
        self.end_to_end = self.end_to_end.or(previous.end_to_end);
        self.lateness = self.lateness.or(previous.lateness);
        self.deadline_to_kafka = self.deadline_to_kafka.or(previous.deadline_to_kafka);
        self.statements = self.statements.or(previous.statements);
        self.kafka_tls = self.kafka_tls.or(previous.kafka_tls);
        self.drain = self.drain.or(previous.drain);
        self.replay = self.replay.or(previous.replay);
        self.migrations = self.migrations.or(previous.migrations);
        self.late_arrivals = self.late_arrivals.or(previous.late_arrivals);
        self.logging = self.logging.or(previous.logging);
        self.profile_pg_stat_statements = self
            .profile_pg_stat_statements
            .or(previous.profile_pg_stat_statements);
        self
    }
}
