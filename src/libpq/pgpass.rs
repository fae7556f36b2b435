//! libpq's password file (`PGPASSFILE`, else `~/.pgpass`): lines of
//! `hostname:port:database:username:password`, read the way libpq reads
//! them (`passwordFromFile` in `fe-connect.c`):
//!
//! - the first line whose four fields match wins;
//! - a field that is `*` alone matches anything; `\:` and `\\` are a `:`
//!   and a `\` (a `\` before any other character is that character);
//! - a line that starts with `#` is a comment; a trailing `\r` is dropped;
//! - the password runs to the next unescaped `:` or the end of the line;
//! - a connection with no host, or to libpq's default socket directory
//!   ([`DEFAULT_SOCKET_DIR`]), is looked up as `localhost`; any other
//!   socket directory as its path; a missing port as `5432`;
//! - no lookup without a user name; the database defaults to the user
//!   name, as the server's does.
//!
//! The file is used only when it is a plain file without group or world
//! access (0600 or stricter), as libpq does on Unix; otherwise it is
//! ignored with a warning naming the file and its mode, never its content.
//! A missing file is ignored silently, as in libpq.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use super::url::Password;

/// libpq's default Unix socket directory as Debian builds it
/// (`DEFAULT_PGSOCKET_DIR`); upstream's default is `/tmp`. A URL with no
/// host, and no `PGHOST`, connects here.
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

/// libpq's default port.
pub const DEFAULT_PORT: u16 = 5432;

/// What a connection is looked up by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key<'a> {
    /// The host as given (a name, an address, or a socket directory); empty
    /// when none was given.
    pub host: &'a str,
    pub port: u16,
    /// The database; `None` means the user's name, as the server takes it.
    pub dbname: Option<&'a str>,
    pub user: &'a str,
}

impl Key<'_> {
    /// The host field this connection matches: `localhost` for no host and
    /// for the default socket directory, as in libpq.
    fn host_field(&self) -> &str {
        if self.host.is_empty() || self.host == DEFAULT_SOCKET_DIR {
            "localhost"
        } else {
            self.host
        }
    }
}

/// The password of the first line of `text` that matches `key`.
pub fn lookup(text: &str, key: &Key<'_>) -> Option<Password> {
    if key.user.is_empty() {
        return None;
    }
    let port = key.port.to_string();
    let dbname = key.dbname.filter(|d| !d.is_empty()).unwrap_or(key.user);
    let wanted = [key.host_field(), port.as_str(), dbname, key.user];
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut rest = line;
        let matched = wanted.iter().all(|token| match field_matches(rest, token) {
            Some(after) => {
                rest = after;
                true
            }
            None => false,
        });
        if matched {
            return Some(Password::new(unescape_password(rest)));
        }
    }
    None
}

/// libpq's `pwdfMatchesString`: whether the field at the start of `line`
/// matches `token`; the rest of the line after its `:` if so.
fn field_matches<'a>(line: &'a str, token: &str) -> Option<&'a str> {
    if let Some(rest) = line.strip_prefix("*:") {
        return Some(rest);
    }
    let mut bytes = line.bytes().enumerate().peekable();
    let mut token = token.bytes();
    while let Some((i, byte)) = bytes.next() {
        let (escaped, byte) = if byte == b'\\' {
            match bytes.next() {
                Some((_, next)) => (true, next),
                None => return None,
            }
        } else {
            (false, byte)
        };
        if byte == b':' && !escaped {
            return token.next().is_none().then(|| &line[i + 1..]);
        }
        if token.next() != Some(byte) {
            return None;
        }
    }
    None
}

/// The password field: up to the first unescaped `:`, escapes removed.
fn unescape_password(field: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut bytes = field.bytes();
    while let Some(byte) = bytes.next() {
        match byte {
            b':' => break,
            b'\\' => match bytes.next() {
                Some(next) => out.push(next),
                None => out.push(b'\\'),
            },
            other => out.push(other),
        }
    }
    out
}

/// Why a password file is not used. The text names the file and, for its
/// permissions, the mode; never anything it holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileProblem {
    #[error("password file {} is not a plain file: ignored", .0.display())]
    NotPlainFile(PathBuf),
    #[error(
        "password file {} has group or world access (mode {mode:04o}); permissions should be \
         u=rw (0600) or less: ignored",
        path.display()
    )]
    Insecure { path: PathBuf, mode: u32 },
    #[error("password file {} cannot be read ({reason}): ignored", path.display())]
    Unreadable { path: PathBuf, reason: String },
}

/// The text of the password file at `path`: `Ok(None)` when there is no
/// such file (ignored silently, as libpq does), an error when it is
/// ignored for a reason worth a warning.
pub fn read(path: &Path) -> Result<Option<PassFileText>, FileProblem> {
    use std::os::unix::fs::MetadataExt as _;
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(FileProblem::Unreadable {
                path: path.to_owned(),
                reason: error.kind().to_string(),
            });
        }
    };
    if !metadata.is_file() {
        return Err(FileProblem::NotPlainFile(path.to_owned()));
    }
    let mode = metadata.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(FileProblem::Insecure {
            path: path.to_owned(),
            mode,
        });
    }
    let bytes = std::fs::read(path).map_err(|error| FileProblem::Unreadable {
        path: path.to_owned(),
        reason: error.kind().to_string(),
    })?;
    Ok(Some(PassFileText(
        String::from_utf8_lossy(&bytes).into_owned(),
    )))
}

/// The content of a password file; its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct PassFileText(String);

impl PassFileText {
    /// The password of the first line matching `key`.
    pub fn lookup(&self, key: &Key<'_>) -> Option<Password> {
        lookup(&self.0, key)
    }
}

impl fmt::Debug for PassFileText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PassFileText(***)")
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn key<'a>(host: &'a str, port: u16, dbname: Option<&'a str>, user: &'a str) -> Key<'a> {
        Key {
            host,
            port,
            dbname,
            user,
        }
    }

    fn found(text: &str, key: &Key<'_>) -> Option<String> {
        lookup(text, key).map(|p| String::from_utf8(p.expose().to_vec()).unwrap())
    }

    #[test]
    fn the_first_matching_line_wins_and_star_matches_anything() {
        let text = "\
# hostname:port:database:username:password
db.example:5432:crm:app:first
db.example:5432:crm:app:second
*:*:*:app:any-app
db.example:*:*:*:any-user
";
        let k = key("db.example", 5432, Some("crm"), "app");
        assert_eq!(found(text, &k).as_deref(), Some("first"));
        let k = key("other", 5433, Some("x"), "app");
        assert_eq!(found(text, &k).as_deref(), Some("any-app"));
        let k = key("db.example", 6543, Some("y"), "bob");
        assert_eq!(found(text, &k).as_deref(), Some("any-user"));
        let k = key("other", 5432, Some("crm"), "bob");
        assert_eq!(found(text, &k), None);
    }

    #[test]
    fn every_field_must_match_exactly() {
        let text = "db:5432:crm:app:pw\n";
        assert_eq!(
            found(text, &key("db", 5432, Some("crm"), "app")).as_deref(),
            Some("pw")
        );
        for k in [
            key("db2", 5432, Some("crm"), "app"),
            key("d", 5432, Some("crm"), "app"),
            key("db", 54321, Some("crm"), "app"),
            key("db", 5432, Some("crmx"), "app"),
            key("db", 5432, Some("crm"), "ap"),
        ] {
            assert_eq!(found(text, &k), None, "{k:?}");
        }
        // A '*' inside a field is a literal character, as in libpq.
        assert_eq!(
            found("d*:5432:crm:app:pw\n", &key("db", 5432, Some("crm"), "app")),
            None
        );
        assert_eq!(
            found("d*:5432:crm:app:pw\n", &key("d*", 5432, Some("crm"), "app")).as_deref(),
            Some("pw")
        );
    }

    #[test]
    fn escaped_colons_and_backslashes() {
        // An IPv6 address as a host, a user with ':', a password with ':'
        // and '\'.
        let text = r"\:\:1:5432:crm:a\:b:pa\:ss\\word
";
        let k = key("::1", 5432, Some("crm"), "a:b");
        assert_eq!(found(text, &k).as_deref(), Some(r"pa:ss\word"));
        // The password ends at an unescaped ':'.
        let k = key("h", 5432, Some("d"), "u");
        assert_eq!(found("h:5432:d:u:one:two\n", &k).as_deref(), Some("one"));
        // A backslash before another character is that character.
        assert_eq!(found(r"h:5432:d:u:\a\b", &k).as_deref(), Some("ab"));
        // CRLF line ends, no final newline, empty password.
        assert_eq!(found("h:5432:d:u:crlf\r\nx", &k).as_deref(), Some("crlf"));
        assert_eq!(found("h:5432:d:u:last", &k).as_deref(), Some("last"));
        assert_eq!(found("h:5432:d:u:", &k).as_deref(), Some(""));
        // Too few fields never match.
        assert_eq!(found("h:5432:d:u\n", &k), None);
        assert_eq!(found("h:5432:d\n", &k), None);
    }

    #[test]
    fn comments_are_skipped() {
        let k = key("h", 5432, Some("d"), "u");
        assert_eq!(found("#h:5432:d:u:commented\n", &k), None);
        assert_eq!(
            found("#h:5432:d:u:commented\nh:5432:d:u:real\n", &k).as_deref(),
            Some("real")
        );
    }

    #[test]
    fn sockets_and_defaults_as_libpq_takes_them() {
        let text = "localhost:5432:*:u:local\n/srv/pg:5433:*:u:custom\n";
        // No host, and libpq's default socket directory, are `localhost`.
        for host in ["", DEFAULT_SOCKET_DIR, "localhost"] {
            assert_eq!(
                found(text, &key(host, 5432, Some("d"), "u")).as_deref(),
                Some("local"),
                "{host:?}"
            );
        }
        // Another socket directory is its path.
        assert_eq!(
            found(text, &key("/srv/pg", 5433, Some("d"), "u")).as_deref(),
            Some("custom")
        );
        assert_eq!(found(text, &key("/tmp", 5432, Some("d"), "u")), None);
        // The database defaults to the user name.
        let text = "h:5432:u:u:same-name\n";
        assert_eq!(
            found(text, &key("h", 5432, None, "u")).as_deref(),
            Some("same-name")
        );
        // No user, no lookup (libpq needs one).
        assert_eq!(found("*:*:*:*:pw\n", &key("h", 5432, Some("d"), "")), None);
    }

    #[test]
    fn the_file_is_used_only_at_0600_or_stricter() {
        let dir = std::env::temp_dir().join(format!("pgpass-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pgpass");
        std::fs::write(&path, "h:5432:d:u:s3cret-in-file\n").unwrap();
        let k = key("h", 5432, Some("d"), "u");
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let text = read(&path).unwrap().expect("a file");
            assert_eq!(
                text.lookup(&k).map(|p| p.expose().to_vec()),
                Some(b"s3cret-in-file".to_vec())
            );
            assert!(!format!("{text:?}").contains("s3cret"));
        }
        for mode in [0o644, 0o640, 0o604, 0o660, 0o601] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let problem = read(&path).unwrap_err();
            assert_eq!(
                problem,
                FileProblem::Insecure {
                    path: path.clone(),
                    mode
                }
            );
            let text = problem.to_string();
            assert!(text.contains(&format!("mode {mode:04o}")), "{text}");
            assert!(text.contains(&path.display().to_string()), "{text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
        assert_eq!(
            read(&dir).unwrap_err(),
            FileProblem::NotPlainFile(dir.clone())
        );
        assert_eq!(read(&dir.join("missing")), Ok(None));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
