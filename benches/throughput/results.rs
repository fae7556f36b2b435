//! Everything one run measured, as one typed value: written once to
//! `results.json` at the end of a run, and read back from it to render the
//! tables again (`BENCH_RENDER_ONLY`).

use std::{collections::BTreeMap, path::Path};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::figures::{
    end_to_end::{Binary, EndToEnd},
    expiry::Comparison,
    idle::IdleCycle,
    profile::ProfileRun,
    publisher::PublisherFigure,
};

/// One run of the bench (the shape of `results.json`).
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
    /// Figures 1 and 2, by key (`figures::expiry::configs` gives their order).
    pub expiry: BTreeMap<String, Comparison>,
    /// Figure 3.
    pub idle_cycle: IdleCycle,
    /// Figure 4.
    pub publisher: PublisherFigure,
    /// Figures 5 and 6.
    pub end_to_end: EndToEnd,
    pub binary: Binary,
    /// The profile pass.
    pub profile_pg_stat_statements: Vec<ProfileRun>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub loadavg_at_start: [f64; 3],
    /// Also the load shown for the binary's size, measured last.
    pub loadavg_at_end: [f64; 3],
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
}
