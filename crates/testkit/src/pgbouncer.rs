//! PgBouncer in transaction pooling mode (`scripts/pgbouncer.sh`) in front
//! of a local PostgreSQL; stopped on drop.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::scripts::{run_script, script};

/// A PgBouncer started by `scripts/pgbouncer.sh` in `dir`; stopped on drop.
#[derive(Debug)]
pub struct PgBouncer {
    dir: PathBuf,
    /// `postgres://USER:PASSWORD@127.0.0.1:PORT` (no database).
    base_url: String,
}

impl PgBouncer {
    /// Starts PgBouncer on `127.0.0.1:port` in front of the server of
    /// `upstream_admin_url` (same user and password), with `pool_size`
    /// server connections per database and user.
    pub fn start(dir: &Path, port: u16, upstream_admin_url: &str, pool_size: u32) -> Result<Self> {
        let upstream = url::Url::parse(upstream_admin_url).context("the upstream URL parses")?;
        let password = upstream
            .password()
            .context("the upstream URL has a password")?;
        let upstream_port = upstream.port().unwrap_or(5432).to_string();
        let dir_text = dir
            .to_str()
            .with_context(|| format!("not UTF-8: {}", dir.display()))?;
        let out = script("pgbouncer.sh")
            .args([
                "start",
                dir_text,
                &port.to_string(),
                &upstream_port,
                &pool_size.to_string(),
            ])
            .env("PG_USER", upstream.username())
            .env("PG_PASSWORD", password)
            .output()
            .context("run scripts/pgbouncer.sh")?;
        anyhow::ensure!(
            out.status.success(),
            "scripts/pgbouncer.sh start failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(Self {
            dir: dir.to_owned(),
            base_url: String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        })
    }

    /// The URL of database `db` through PgBouncer.
    pub fn url(&self, db: &str) -> String {
        format!("{}/{db}", self.base_url)
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.to_str() {
            let _ = run_script("pgbouncer.sh", &["stop", dir]);
        }
    }
}
