//! The repository's scripts (`scripts/*.sh`), free loopback ports and
//! scratch folders the `postgres` OS user can enter.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
};

use anyhow::{Context, Result, ensure};

/// The repository root (where `scripts/` lives): the folder above the
/// running test's package (`CARGO_MANIFEST_DIR` as cargo sets it when it
/// runs a test or bench, else the working folder) that holds
/// `scripts/test.sh`. Found at run time: a build cache shared by clones in
/// other folders (CI's clean clone, the one worked in) keeps this crate's
/// compiled copy while its sources are unchanged, and a path taken at
/// compile time would name the clone that built it, or one gone since.
pub fn repo() -> &'static Path {
    static REPO: OnceLock<PathBuf> = OnceLock::new();
    REPO.get_or_init(|| {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map(PathBuf::from)
            .or_else(|| std::env::current_dir().ok())
            .and_then(|dir| {
                dir.ancestors()
                    .find(|d| d.join("scripts").join("test.sh").is_file())
                    .map(Path::to_path_buf)
            })
            .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")))
    })
}

/// `bash scripts/NAME`, run from the repository root, stdin closed.
pub fn script(name: &str) -> Command {
    let mut command = Command::new("bash");
    command
        .current_dir(repo())
        .arg(repo().join("scripts").join(name))
        .stdin(Stdio::null());
    command
}

/// Runs `bash scripts/NAME ARGS...` and returns its stdout; an error carries
/// its stderr.
pub fn run_script(name: &str, args: &[&str]) -> Result<String> {
    let mut command = script(name);
    command.args(args);
    run(command, &format!("scripts/{name} {args:?}"))
}

/// Runs `command` (a [`script`] with its arguments and environment set) and
/// returns its stdout; an error names it as `what` and carries its stderr.
pub fn run(mut command: Command, what: &str) -> Result<String> {
    let out = command.output().with_context(|| format!("run {what}"))?;
    ensure!(
        out.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A free loopback port.
///
/// Drawn below the kernel's ephemeral range: a port inside it can be taken,
/// while the server on it is stopped, as the local port of any outgoing
/// connection, and the server then cannot bind it again (a Kafka node
/// relaunched in the cluster test failed with "Address already in use" on
/// its controller port). The kernel's own choice only when that range
/// leaves no room below it.
pub fn free_port() -> u16 {
    const FLOOR: u16 = 10_000;
    // Room for a block of consecutive ports (`free_port_block`).
    let top = ephemeral_low().saturating_sub(64);
    if top > FLOOR + 1_000 {
        for _ in 0..1_000 {
            let draw = uuid::Uuid::new_v4().as_u128() % u128::from(top - FLOOR);
            let port = FLOOR + u16::try_from(draw).unwrap_or(0);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port")
}

/// The first port of the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`; Linux's default 32768).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A free port whose successor is free too (Kafka's controller port).
pub fn free_port_pair() -> u16 {
    free_port_pairs(1)[0]
}

/// `n` distinct [`free_port_pair`]s (what `scripts/free-port.py N` prints).
pub fn free_port_pairs(n: usize) -> Vec<u16> {
    let mut found = Vec::with_capacity(n);
    while found.len() < n {
        let port = free_port();
        if port < 65000
            && !found.contains(&port)
            && !found.contains(&(port - 1))
            && !found.contains(&(port + 1))
            && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok()
        {
            found.push(port);
        }
    }
    found
}

/// The first of `n` consecutive free loopback ports (a broker with several
/// listeners).
pub fn free_port_block(n: u16) -> u16 {
    loop {
        let first = free_port();
        if first < 65000
            && (1..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", first + i)).is_ok())
        {
            return first;
        }
    }
}

/// A fresh folder under the temporary directory that the `postgres` OS user
/// can enter (it owns a cluster started inside). The name is short: a
/// cluster's Unix socket inside must stay within 107 bytes, also under the
/// test command's own `TMPDIR` (`/tmp/booking-expiration-test.XXXXXX/tmp`).
pub fn tempdir(prefix: &str) -> Result<PathBuf> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let dir = std::env::temp_dir().join(format!("booking-expiration-{prefix}-{}", &id[..12]));
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}
