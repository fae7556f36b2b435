//! Child processes: the binary under test and a handle that drains its
//! stderr and kills it if the test fails, SIGTERM and waiting for exit,
//! plain HTTP against its endpoints, free ports and scratch folders.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

pub use testkit::{free_port, free_port_pair};

use super::{TestDb, kafka_bootstrap, wait_until};

/// Runs the binary with `args` against `database_url`, panics with its
/// stderr unless it exits 0, and returns its stdout.
pub fn run_ok(database_url: &str, args: &[&str]) -> String {
    let output = binary()
        .args(args)
        .env("DATABASE_URL", database_url)
        .output()
        .expect("run the binary");
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 stdout")
}

/// The binary under test, without the settings a developer's shell may have.
///
/// libpq's variables (`PGHOST`, `PGPASSWORD`, ...) are removed and `HOME`
/// is an empty folder of this test run, so no `~/.pgpass` of the
/// developer's is read; a test sets its own.
pub fn binary() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_booking-expiration"));
    for name in [
        "DATABASE_URL",
        "KAFKA_BOOTSTRAP_SERVERS",
        "KAFKA_TOPIC",
        "EXPIRATION_INTERVAL",
        "EXPIRATION_BATCH_SIZE",
        "METRICS_ADDR",
    ]
    .into_iter()
    .chain(LIBPQ_VARIABLES)
    {
        command.env_remove(name);
    }
    command.env("HOME", empty_home());
    command.env("RUST_LOG", "info");
    command
}

/// `run` against `db`, the test broker and `topic`, serving `/metrics` on
/// `metrics_addr`; every other setting at its default unless the caller
/// adds it.
pub fn run_on(db: &TestDb, topic: &str, metrics_addr: &str) -> std::process::Command {
    let mut command = binary();
    command
        .arg("run")
        .env("DATABASE_URL", &db.url)
        .env("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap().join(","))
        .env("KAFKA_TOPIC", topic)
        .env("METRICS_ADDR", metrics_addr);
    command
}

/// Sends `signal` (`STOP`, `CONT`, `KILL`) to `pid` with kill(1).
pub fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// `name`'s value in the `/metrics` served on `addr` (0 when absent or
/// not served). `name` is the whole series name, labels included.
pub async fn metric(addr: &str, name: &str) -> f64 {
    let Some((_, text)) = http_get(addr, "/metrics").await else {
        return 0.0;
    };
    text.lines()
        .find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// The libpq variables the binary reads.
pub const LIBPQ_VARIABLES: [&str; 12] = [
    "PGHOST",
    "PGPORT",
    "PGDATABASE",
    "PGUSER",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSSLMODE",
    "PGSSLROOTCERT",
    "PGSSLCERT",
    "PGSSLKEY",
    "PGAPPNAME",
    "PGCONNECT_TIMEOUT",
];

/// An empty folder, the `HOME` of every spawned binary unless a test sets
/// its own.
pub fn empty_home() -> PathBuf {
    static HOME: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    HOME.get_or_init(|| tempdir("home")).clone()
}

/// A fresh folder the `postgres` OS user can enter.
pub fn tempdir(prefix: &str) -> PathBuf {
    testkit::tempdir(prefix).expect("create a scratch folder")
}

/// A plain HTTP GET; returns (status, body), or None while nothing listens.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// Waits until `GET path` answers with `status`.
pub async fn wait_http_status(addr: &str, path: &str, status: u16, timeout: Duration) {
    wait_until(&format!("{path} to answer {status}"), timeout, || async {
        http_get(addr, path).await.is_some_and(|(s, _)| s == status)
    })
    .await;
}

/// A finished process's stderr, as text.
pub fn stderr_of(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Sends SIGTERM to a child process.
pub fn terminate(child: &std::process::Child) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// Waits for a child to exit, killing it after `timeout`.
pub async fn wait_exit(
    child: &mut std::process::Child,
    timeout: Duration,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("process did not exit within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A running binary: its stderr is drained on a thread (a full pipe would
/// block the process) and it is killed if the test fails before stopping it.
pub struct Running {
    pub child: std::process::Child,
    stderr: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    pub fn spawn(mut command: std::process::Command) -> Self {
        command.stderr(std::process::Stdio::piped());
        let mut child = command.spawn().expect("spawn the binary");
        let mut pipe = child.stderr.take().expect("stderr pipe");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            let reader = std::io::BufReader::new(&mut pipe);
            for line in reader.lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        Self {
            child,
            stderr,
            reader: Some(reader),
        }
    }

    /// Everything written to stderr so far (all of it once exited).
    pub fn stderr(&mut self) -> String {
        if self.child.try_wait().ok().flatten().is_some()
            && let Some(reader) = self.reader.take()
        {
            let _ = reader.join();
        }
        self.stderr.lock().unwrap().clone()
    }

    /// Polls stderr every 50 ms until it contains `text`; past `timeout`
    /// fails with everything the process printed.
    pub async fn wait_for_log(&mut self, text: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.stderr();
            if log.contains(text) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {text:?} in the log:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn terminate(&self) {
        terminate(&self.child);
    }

    pub async fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        wait_exit(&mut self.child, timeout).await
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
