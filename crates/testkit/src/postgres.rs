//! PostgreSQL: a throwaway cluster (`scripts/postgres.sh`) that stops on
//! drop, database URLs on a server, creating and force-dropping databases,
//! and `count(*)`-style queries.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use diesel::{QueryableByName, sql_types::BigInt};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::scripts::{run_script, script};

/// A cluster started by `scripts/postgres.sh` in `dir`; stopped on drop.
#[derive(Debug)]
pub struct Postgres {
    dir: PathBuf,
    port: u16,
    /// The superuser URL (`postgres` database) of the cluster.
    pub admin_url: String,
}

impl Postgres {
    /// Starts a cluster in `dir` on `127.0.0.1:port`; `options` are
    /// `postgres -c` settings (`["-c", "fsync=off"]`).
    pub fn start(dir: &Path, port: u16, options: &[&str]) -> Result<Self> {
        let mut args = vec!["start", path_str(dir)?];
        let port_text = port.to_string();
        args.push(&port_text);
        args.extend_from_slice(options);
        let admin_url = run_script("postgres.sh", &args)?.trim().to_owned();
        Ok(Self {
            dir: dir.to_owned(),
            port,
            admin_url,
        })
    }

    /// The folder the cluster lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Fast shutdown (a fault: clients see the server go away).
    pub fn stop(&self) -> Result<()> {
        run_script("postgres.sh", &["stop", path_str(&self.dir)?]).map(drop)
    }

    /// Starts the stopped cluster again, same port and settings.
    pub fn start_again(&self) -> Result<()> {
        run_script(
            "postgres.sh",
            &["start", path_str(&self.dir)?, &self.port.to_string()],
        )
        .map(drop)
    }

    /// Fast restart (a fault: every connection is cut).
    pub fn restart(&self) -> Result<()> {
        run_script("postgres.sh", &["restart", path_str(&self.dir)?]).map(drop)
    }

    /// A streaming standby of this (running) cluster in `dir` on
    /// `127.0.0.1:port` (`pg_basebackup -R`), already streaming.
    pub fn start_standby(&self, dir: &Path, port: u16) -> Result<Self> {
        let port_text = port.to_string();
        let admin_url = run_script(
            "postgres.sh",
            &["standby", path_str(&self.dir)?, path_str(dir)?, &port_text],
        )?
        .trim()
        .to_owned();
        Ok(Self {
            dir: dir.to_owned(),
            port,
            admin_url,
        })
    }

    /// Makes commits wait for the standby (`synchronous_standby_names`).
    pub fn require_sync_standby(&self) -> Result<()> {
        run_script("postgres.sh", &["sync", path_str(&self.dir)?]).map(drop)
    }

    /// Promotes this standby to a primary.
    pub fn promote(&self) -> Result<()> {
        run_script("postgres.sh", &["promote", path_str(&self.dir)?]).map(drop)
    }

    /// SIGKILL to the postmaster: a crash (its backends follow).
    pub fn kill(&self) -> Result<()> {
        run_script("postgres.sh", &["kill", path_str(&self.dir)?]).map(drop)
    }

    /// The port the cluster listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the cluster in `dir`, ignoring failures (cleanup paths).
    pub fn stop_dir(dir: &Path) {
        let _ = script("postgres.sh")
            .arg("stop")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        Self::stop_dir(&self.dir);
    }
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .with_context(|| format!("not UTF-8: {}", path.display()))
}

/// The URL of database `db` on the server of `admin_url`.
pub fn url_of(admin_url: &str, db: &str) -> Result<String> {
    let mut url = url::Url::parse(admin_url).context("the admin URL parses")?;
    url.set_path(&format!("/{db}"));
    Ok(url.to_string())
}

/// Runs `sql` (one or more statements) on a fresh connection to `url`.
pub async fn exec(url: &str, sql: &str) -> Result<()> {
    let mut conn = AsyncPgConnection::establish(url)
        .await
        .context("connect to PostgreSQL")?;
    conn.batch_execute(sql)
        .await
        .with_context(|| sql.to_owned())
}

/// Creates database `name` (a plain identifier) on the server of `admin_url`
/// and returns its URL.
pub async fn create_database(admin_url: &str, name: &str) -> Result<String> {
    exec(admin_url, &format!("CREATE DATABASE {name}")).await?;
    url_of(admin_url, name)
}

/// Drops database `name`, ending the sessions still connected to it.
pub async fn drop_database(admin_url: &str, name: &str) -> Result<()> {
    exec(
        admin_url,
        &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
    )
    .await
}

/// One row with a `bigint` column `n` (`SELECT count(*) AS n ...`).
#[derive(Debug, QueryableByName)]
pub struct Count {
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

/// A query returning one row with a `bigint` column `n`.
pub async fn count(conn: &mut AsyncPgConnection, sql: &str) -> Result<i64> {
    let row: Count = diesel::sql_query(sql)
        .get_result(conn)
        .await
        .with_context(|| sql.to_owned())?;
    Ok(row.n)
}
