//! The crate's layering, as `src/lib.rs` declares it, holds in the code.
//!
//! Two levels, both declared in the crate docs of `src/lib.rs`, and nowhere
//! else:
//!
//! - `# Layers`: the top-level modules, numbered from the top. A module
//!   uses only modules of the layers below its own, never one of its own
//!   layer or above.
//! - `## Rooms of `folder``: the rooms of one folder module (its files and
//!   subfolders), numbered the same way and under the same rule. The
//!   folder's root file (`folder.rs` or `folder/mod.rs`) is its front door
//!   and in no layer: it may use every room (it declares, wires and
//!   re-exports them), and every room may use what the root file defines
//!   itself (the folder's error enum, say). A use of an item that the root
//!   file imports from a room (`use super::KafkaError` where the root says
//!   `pub use kafka::KafkaError`) is a use of that room. A list may end
//!   with a paragraph `Allowed against the order: `a` -> `b`, … (why)`:
//!   exactly those arrows are let through, each one named where the order
//!   is declared. Every room of a listed folder must be in its list, and
//!   every listed room must exist.
//!
//! Every `crate::`, `$crate::` and `super::` path outside comments and
//! string literals counts, in `use` declarations and in code alike. **Test
//! code is held to the same rules**: `#[cfg(test)]` modules are read like
//! the rest of their file (a `super::` inside one is resolved from where it
//! stands). A unit test that needs a higher layer belongs to that layer's
//! tests; `config::cli`'s test of the Kafka TLS start-up check, which
//! reached up into `app`, moved to `app`'s tests for this.
//!
//! The check reads the sources only, so it needs no server: CI runs it in
//! its first stage, right after clippy (`cargo test --locked --test
//! layering`).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// What `src/lib.rs` declares.
#[derive(Debug, Default, PartialEq, Eq)]
struct Declared {
    /// Top-level module → layer (1 is the top).
    layers: BTreeMap<String, usize>,
    /// Folder (`config`, `outbox::kafka`) → its rooms.
    folders: BTreeMap<String, Rooms>,
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Rooms {
    /// Room → layer within the folder (1 is the top).
    layers: BTreeMap<String, usize>,
    /// Arrows let through against the order: (from, to).
    allowed: BTreeSet<(String, String)>,
}

/// The names of a numbered list item (`2. [`expiry`], [`outbox`]`).
fn listed_names(names: &str) -> Vec<String> {
    names
        .split(", ")
        .map(|name| {
            name.trim()
                .trim_matches(|c| matches!(c, '[' | ']' | '`'))
                .to_owned()
        })
        .collect()
}

/// Every `` `a` -> `b` `` pair in `text`.
fn arrows_in(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("` -> `") {
        let before = &rest[..at];
        let from = before.rsplit('`').next().unwrap_or_default();
        let after = &rest[at + "` -> `".len()..];
        let to = after.split('`').next().unwrap_or_default();
        found.push((from.to_owned(), to.to_owned()));
        rest = after;
    }
    found
}

/// Reads the `# Layers` list and every `## Rooms of `folder`` list of the
/// crate docs.
fn declared(lib: &str) -> Declared {
    enum Section {
        None,
        Layers,
        Rooms(String),
    }
    let mut declared = Declared::default();
    let mut section = Section::None;
    // The paragraph of allowed arrows (it may span lines): its folder and text.
    let mut allowing: Option<(String, String)> = None;
    for line in lib.lines().chain(std::iter::once("//!")) {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let doc = doc.trim();
        if (doc.is_empty() || doc.starts_with('#'))
            && let Some((folder, text)) = allowing.take()
        {
            let rooms = declared.folders.entry(folder).or_default();
            rooms.allowed.extend(arrows_in(&text));
        }
        if doc.starts_with('#') {
            section = if doc == "# Layers" {
                Section::Layers
            } else if let Some(folder) = doc.strip_prefix("## Rooms of ") {
                let folder = folder.trim_matches('`').to_owned();
                declared.folders.entry(folder.clone()).or_default();
                Section::Rooms(folder)
            } else {
                Section::None
            };
            continue;
        }
        if let Section::Rooms(folder) = &section
            && doc.starts_with("Allowed against the order")
        {
            allowing = Some((folder.clone(), String::new()));
        }
        if let Some((_, text)) = &mut allowing {
            text.push(' ');
            text.push_str(doc);
            continue;
        }
        let Some((number, names)) = doc.split_once(". ") else {
            continue;
        };
        let Ok(number) = number.parse::<usize>() else {
            continue;
        };
        match &section {
            Section::Layers => {
                for name in listed_names(names) {
                    declared.layers.insert(name, number);
                }
            }
            Section::Rooms(folder) => {
                let rooms = declared.folders.entry(folder.clone()).or_default();
                for name in listed_names(names) {
                    rooms.layers.insert(name, number);
                }
            }
            Section::None => {}
        }
    }
    declared
}

/// `source` with comments blanked out and string and character literals
/// emptied, so that only code is left. Lines and braces of code stay
/// where they were.
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
            continue;
        }
        // Raw strings: r"…", r#"…"#, br"…".
        let raw_start = match (c, next) {
            ('r', Some('"' | '#')) => Some(i + 1),
            ('b', Some('r')) if matches!(chars.get(i + 2), Some('"' | '#')) => Some(i + 2),
            _ => None,
        };
        let after_identifier = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if let Some(mut j) = raw_start.filter(|_| !after_identifier) {
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) == Some(&'"') {
                j += 1;
                while j < chars.len() {
                    if chars[j] == '"' && (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
                continue;
            }
        }
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
            continue;
        }
        if c == '\'' {
            // A character literal ('x', '\n', '\''); otherwise a lifetime.
            if next == Some('\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
                continue;
            }
            if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

fn is_identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn identifier_at(text: &str) -> &str {
    let end = text
        .char_indices()
        .find(|(_, c)| !is_identifier_char(*c))
        .map_or(text.len(), |(i, _)| i);
    &text[..end]
}

/// One path of a use tree: its segments and the name it is imported as
/// (`a::b as c`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct UsePath {
    segments: Vec<String>,
    alias: Option<String>,
}

impl UsePath {
    /// The name the path brings into scope.
    fn name(&self) -> Option<&String> {
        self.alias.as_ref().or_else(|| {
            let mut names = self.segments.iter().rev();
            match names.next() {
                Some(last) if last == "self" => names.next(),
                last => last,
            }
        })
    }
}

fn leading(text: &str, skip: impl Fn(char) -> bool) -> usize {
    text.len() - text.trim_start_matches(skip).len()
}

/// The paths of one use tree or path expression starting at `text`
/// (`a::b`, `a::{b, c::{d, e}}`, `a::b as c`). Returns them and how much
/// of `text` they took (0: no path there).
fn tree_at(text: &str) -> (Vec<UsePath>, usize) {
    let mut segments: Vec<String> = Vec::new();
    let mut at = leading(text, char::is_whitespace);
    loop {
        let rest = &text[at..];
        if rest.starts_with('{') {
            at += 1;
            let mut paths = Vec::new();
            loop {
                at += leading(&text[at..], |c| c.is_whitespace() || c == ',');
                let inner = &text[at..];
                if inner.is_empty() {
                    break;
                }
                if inner.starts_with('}') {
                    at += 1;
                    break;
                }
                let (sub, used) = tree_at(inner);
                if used == 0 {
                    // Not a path (`*`, a stray token): step over it.
                    at += inner.chars().next().map_or(1, char::len_utf8);
                    continue;
                }
                for path in sub {
                    paths.push(UsePath {
                        segments: [segments.clone(), path.segments].concat(),
                        alias: path.alias,
                    });
                }
                at += used;
            }
            return (paths, at);
        }
        let name = match rest.strip_prefix('$') {
            Some(after) => format!("${}", identifier_at(after)),
            None => identifier_at(rest).to_owned(),
        };
        if name.is_empty() || name == "$" {
            // A glob, a generic argument list or the end of the path.
            let paths = if segments.is_empty() {
                Vec::new()
            } else {
                vec![UsePath {
                    segments,
                    alias: None,
                }]
            };
            return (
                paths,
                if at == leading(text, char::is_whitespace) {
                    0
                } else {
                    at
                },
            );
        }
        at += name.len();
        segments.push(name);
        let spaced = leading(&text[at..], char::is_whitespace);
        let after = &text[at + spaced..];
        if after.starts_with("::") {
            at += spaced + 2;
            at += leading(&text[at..], char::is_whitespace);
            continue;
        }
        if let Some(alias_text) = after
            .strip_prefix("as")
            .filter(|t| t.starts_with(char::is_whitespace))
        {
            let gap = leading(alias_text, char::is_whitespace);
            let alias = identifier_at(&alias_text[gap..]);
            at += spaced + 2 + gap + alias.len();
            return (
                vec![UsePath {
                    segments,
                    alias: Some(alias.to_owned()),
                }],
                at,
            );
        }
        return (
            vec![UsePath {
                segments,
                alias: None,
            }],
            at,
        );
    }
}

/// One path a file names: where it stands (the inline modules around it)
/// and its segments as written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Named {
    inline: Vec<String>,
    segments: Vec<String>,
}

/// Every path starting with `crate`, `$crate` or `super` in the code of
/// a file, with the inline modules (`mod tests { … }`) it stands in.
fn named_paths(code: &str) -> Vec<Named> {
    let mut found = Vec::new();
    // The inline modules open at this point: (name, brace depth inside).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut pending_mod: Option<String> = None;
    let mut i = 0;
    let mut previous = ' ';
    while let Some(c) = code[i..].chars().next() {
        let starts_word = !is_identifier_char(previous) && previous != '$';
        previous = c;
        match c {
            '{' => {
                depth += 1;
                if let Some(name) = pending_mod.take() {
                    inline.push((name, depth));
                }
            }
            '}' => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            ';' => pending_mod = None,
            c if starts_word && (c.is_ascii_alphabetic() || c == '_' || c == '$') => {
                let rest = &code[i..];
                let word = match rest.strip_prefix('$') {
                    Some(after) => format!("${}", identifier_at(after)),
                    None => identifier_at(rest).to_owned(),
                };
                let after_word = &code[i + word.len()..];
                if word == "mod" {
                    let name = identifier_at(after_word.trim_start());
                    if !name.is_empty() {
                        pending_mod = Some(name.to_owned());
                    }
                } else if matches!(word.as_str(), "crate" | "$crate" | "super")
                    && after_word.trim_start().starts_with("::")
                {
                    let (paths, used) = tree_at(rest);
                    let here: Vec<String> = inline.iter().map(|(name, _)| name.clone()).collect();
                    found.extend(paths.into_iter().map(|path| Named {
                        inline: here.clone(),
                        segments: path.segments,
                    }));
                    let used = used.max(word.len());
                    previous = code[..i + used].chars().next_back().unwrap_or(' ');
                    i += used;
                    continue;
                }
                previous = word.chars().next_back().unwrap_or(' ');
                i += word.len().max(1);
                continue;
            }
            _ => {}
        }
        i += c.len_utf8();
    }
    found
}

/// A file's module path from its path under `src/` (`config/cli.rs` →
/// `config::cli`, `db/mod.rs` → `db`).
fn module_path(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    parts
}

/// The absolute module path a named path points into, or `None` when it
/// leaves the crate.
fn resolve(file_module: &[String], named: &Named) -> Option<Vec<String>> {
    let mut base: Vec<String> = file_module.to_vec();
    base.extend(named.inline.iter().cloned());
    let mut segments = named.segments.iter().peekable();
    let mut path = match segments.peek().map(|s| s.as_str()) {
        Some("crate" | "$crate") => {
            segments.next();
            Vec::new()
        }
        Some("super") => {
            while segments.peek().is_some_and(|s| *s == "super") {
                segments.next();
                base.pop()?;
            }
            base
        }
        _ => return None,
    };
    path.extend(segments.filter(|s| *s != "self").cloned());
    Some(path)
}

/// One source file: its path under `src/` and its code.
struct Source {
    path: String,
    code: String,
}

impl Source {
    fn new(path: &str, text: &str) -> Self {
        Self {
            path: path.to_owned(),
            code: code_only(text),
        }
    }

    fn module(&self) -> Vec<String> {
        module_path(&self.path)
    }
}

/// What one file names, resolved: (absolute path, as written).
fn arrows_of(source: &Source) -> Vec<(Vec<String>, String)> {
    let module = source.module();
    named_paths(&source.code)
        .into_iter()
        .filter_map(|named| {
            let written = named.segments.join("::");
            resolve(&module, &named).map(|path| (path, written))
        })
        .collect()
}

/// The rooms of `folder`: the modules one level below it that have files.
fn rooms_of(folder: &[String], sources: &[Source]) -> BTreeSet<String> {
    sources
        .iter()
        .map(Source::module)
        .filter(|module| module.len() > folder.len() && module.starts_with(folder))
        .map(|module| module[folder.len()].clone())
        .collect()
}

/// What a folder's root file imports: name → the room it comes from.
fn root_imports(
    folder: &[String],
    sources: &[Source],
    rooms: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let mut imports = BTreeMap::new();
    let Some(root) = sources.iter().find(|s| s.module() == folder) else {
        return imports;
    };
    let code = &root.code;
    let mut rest = code.as_str();
    while let Some(at) = rest.find("use ") {
        let starts_word = at == 0 || !is_identifier_char(rest.as_bytes()[at - 1] as char);
        rest = &rest[at + "use ".len()..];
        if !starts_word {
            continue;
        }
        let (paths, _) = tree_at(rest);
        for mut path in paths {
            if path.segments.first().is_some_and(|s| s == "self") {
                path.segments.remove(0);
            }
            let Some(room) = path.segments.first().filter(|s| rooms.contains(*s)) else {
                continue;
            };
            if let Some(name) = path.name() {
                imports.insert(name.clone(), room.clone());
            }
        }
    }
    imports
}

/// Every arrow against the declared layers and rooms, one line each.
fn violations(declared: &Declared, sources: &[Source]) -> Vec<String> {
    let mut found = Vec::new();
    let top: BTreeSet<String> = sources
        .iter()
        .filter_map(|s| s.module().first().cloned())
        .collect();
    // The top level.
    for source in sources {
        let module = source.module();
        let Some(from) = module.first() else { continue };
        let Some(&from_layer) = declared.layers.get(from) else {
            found.push(format!(
                "{}: module {from} is in no layer of the crate docs",
                source.path
            ));
            continue;
        };
        for (path, written) in arrows_of(source) {
            let Some(to) = path.first() else { continue };
            if to == from {
                continue;
            }
            match declared.layers.get(to) {
                Some(&to_layer) if to_layer > from_layer => {}
                Some(&to_layer) => found.push(format!(
                    "{}: {from} (layer {from_layer}) -> {to} (layer {to_layer}) by {written}",
                    source.path
                )),
                None if top.contains(to) => found.push(format!(
                    "{}: {from} -> {to}, which is in no layer",
                    source.path
                )),
                None => found.push(format!(
                    "{}: {from} -> {to} (by {written}), which is no module of the crate",
                    source.path
                )),
            }
        }
    }
    // The rooms of each listed folder.
    for (name, rooms) in &declared.folders {
        let folder: Vec<String> = name.split("::").map(str::to_owned).collect();
        let present = rooms_of(&folder, sources);
        if present.is_empty() {
            found.push(format!("rooms of {name}: no such folder under src/"));
            continue;
        }
        for room in present.difference(&rooms.layers.keys().cloned().collect()) {
            found.push(format!(
                "rooms of {name}: {room} is in no layer of the list in src/lib.rs"
            ));
        }
        for room in rooms.layers.keys().filter(|room| !present.contains(*room)) {
            found.push(format!("rooms of {name}: {room} is listed but has no file"));
        }
        let imports = root_imports(&folder, sources, &present);
        for source in sources {
            let module = source.module();
            if module.len() <= folder.len() || !module.starts_with(&folder) {
                continue;
            }
            let from = &module[folder.len()];
            let Some(&from_layer) = rooms.layers.get(from) else {
                continue;
            };
            for (path, written) in arrows_of(source) {
                if path.len() <= folder.len() || !path.starts_with(&folder) {
                    continue;
                }
                let named = &path[folder.len()];
                let to = if present.contains(named) {
                    named
                } else if let Some(room) = imports.get(named) {
                    room
                } else {
                    // Defined by the root file itself: free for every room.
                    continue;
                };
                if to == from || rooms.allowed.contains(&(from.clone(), to.clone())) {
                    continue;
                }
                let Some(&to_layer) = rooms.layers.get(to) else {
                    continue;
                };
                if to_layer <= from_layer {
                    found.push(format!(
                        "{}: {name}::{from} (room layer {from_layer}) -> {name}::{to} (room layer {to_layer}) by {written}",
                        source.path
                    ));
                }
            }
        }
        for (from, to) in &rooms.allowed {
            if !rooms.layers.contains_key(from) || !rooms.layers.contains_key(to) {
                found.push(format!(
                    "rooms of {name}: allowed arrow {from} -> {to} names a room not in the list"
                ));
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

fn sources(dir: &Path, root: &Path, out: &mut Vec<Source>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).expect("under src/");
            let relative = relative.to_string_lossy().replace('\\', "/");
            // The crate root declares the layers; the binary is above them all.
            if relative != "lib.rs" && relative != "main.rs" {
                let text = std::fs::read_to_string(&path).expect("read a source file");
                out.push(Source::new(&relative, &text));
            }
        }
    }
}

#[test]
fn every_path_follows_the_layers_and_rooms_the_crate_docs_list() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read src/lib.rs");
    let declared = declared(&lib);
    let modules: Vec<String> = lib
        .lines()
        .filter_map(|line| line.strip_prefix("pub mod "))
        .map(|name| name.trim_end_matches(';').to_owned())
        .collect();
    assert!(modules.len() >= 10, "the modules of lib.rs: {modules:?}");
    for module in &modules {
        assert!(
            declared.layers.contains_key(module),
            "module {module} is in no layer of lib.rs's `# Layers` list: {:?}",
            declared.layers
        );
    }
    for folder in ["config", "db", "expiry", "libpq", "outbox"] {
        assert!(
            declared.folders.contains_key(folder),
            "src/lib.rs lists no rooms of {folder}"
        );
    }
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    assert!(files.len() > 40, "the source files: {}", files.len());
    let found = violations(&declared, &files);
    assert!(
        found.is_empty(),
        "paths against the layers and rooms of src/lib.rs:\n{}",
        found.join("\n")
    );
}

/// The crate docs the self-tests below declare: three layers, and the
/// rooms of `db` with one allowed arrow.
const DOCS: &str = "\
//! # Layers
//!
//! 1. [`app`]
//! 2. [`db`], [`telemetry`]
//! 3. [`config`]
//!
//! ## Rooms of `db`
//!
//! 1. `replay`
//! 2. `bookings`, `outbox`
//! 3. `pool`
//!
//! Allowed against the order: `pool` -> `outbox` (a
//! planted exception).
//!
//! # Other
//! 4. [`ignored`]
";

fn check(files: &[(&str, &str)]) -> Vec<String> {
    let sources: Vec<Source> = files
        .iter()
        .map(|(path, text)| Source::new(path, text))
        .collect();
    violations(&declared(DOCS), &sources)
}

/// A `db` folder that keeps its rooms' order, and a root that defines the
/// error and re-exports the pool.
const DB: [(&str, &str); 5] = [
    (
        "db/mod.rs",
        "mod bookings;\nmod outbox;\nmod pool;\nmod replay;\npub use pool::{PgPool, connect as open};\npub enum DbError {}\nuse crate::config::X;\n",
    ),
    ("db/pool.rs", "use super::DbError;\nuse crate::config;\n"),
    (
        "db/bookings.rs",
        "use super::{DbError, PgPool};\nfn f() { super::pool::open(); }\n",
    ),
    ("db/outbox.rs", "use super::DbError;\n"),
    (
        "db/replay.rs",
        "use super::{DbError, bookings::headers};\nuse crate::db::outbox;\n",
    ),
];

fn with(extra: &[(&'static str, &'static str)]) -> Vec<String> {
    let mut files: Vec<(&str, &str)> = DB.to_vec();
    files.retain(|(path, _)| !extra.iter().any(|(p, _)| p == path));
    files.extend_from_slice(extra);
    check(&files)
}

#[test]
fn the_lists_are_read_from_the_crate_docs() {
    let declared = declared(DOCS);
    assert_eq!(declared.layers.len(), 4, "{declared:?}");
    assert!(!declared.layers.contains_key("ignored"));
    let db = &declared.folders["db"];
    assert_eq!(db.layers["replay"], 1);
    assert_eq!(db.layers["outbox"], 2);
    assert_eq!(db.layers["pool"], 3);
    assert_eq!(
        db.allowed,
        BTreeSet::from([("pool".to_owned(), "outbox".to_owned())])
    );
}

/// The check sees arrows between top-level modules in every form the code
/// writes them, and not in comments or string literals.
#[test]
fn the_layering_check_finds_an_arrow_upwards() {
    assert!(with(&[]).is_empty(), "{:?}", with(&[]));
    let upwards =
        "use crate::{\n    config::X,\n    db::{pool::P, Q},\n};\nfn f() { crate::app::run(); }\n";
    assert_eq!(
        with(&[("db/pool.rs", upwards)]),
        vec!["db/pool.rs: db (layer 2) -> app (layer 1) by crate::app::run".to_owned()]
    );
    assert_eq!(
        with(&[("telemetry.rs", "use crate::db::PgPool;\n")]),
        vec!["telemetry.rs: telemetry (layer 2) -> db (layer 2) by crate::db::PgPool".to_owned()],
        "its own layer"
    );
    let quiet = "// crate::app::x\n/// [`crate::app`]\n/* crate::app::y /* nested */ */\n\
                 const SQL: &str = \"crate::app::z\";\nconst RAW: &str = r#\"super::super::app\"#;\n\
                 fn f<'a>(c: char) -> bool { c == '{' }\nuse crate::config;\n";
    assert!(with(&[("telemetry.rs", quiet)]).is_empty());
    assert_eq!(
        with(&[("config/parse.rs", "use crate::nowhere;\n")]),
        vec!["config/parse.rs: config -> nowhere (by crate::nowhere), which is no module of the crate".to_owned()]
    );
    assert_eq!(
        with(&[("config.rs", "use super::app::X;\n")]),
        vec!["config.rs: config (layer 3) -> app (layer 1) by super::app::X".to_owned()],
        "super:: from a top-level file is the crate root"
    );
}

/// Test modules are held to the same rule, and a `super::` inside one
/// points at its own file.
#[test]
fn test_modules_are_held_to_the_same_rule() {
    let test_up = "use crate::config;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::app::y;\n}\n";
    assert_eq!(
        with(&[("telemetry.rs", test_up)]),
        vec!["telemetry.rs: telemetry (layer 2) -> app (layer 1) by crate::app::y".to_owned()]
    );
    let test_own = "#[cfg(test)]\nmod tests {\n    use super::{super::DbError, *};\n    mod inner { use super::super::super::outbox::Row; }\n}\n";
    assert!(
        with(&[("db/outbox.rs", test_own)]).is_empty(),
        "{:?}",
        with(&[("db/outbox.rs", test_own)])
    );
}

/// The rooms of a listed folder: arrows upwards or within a layer, by
/// `super::room`, by `crate::folder::room` and by an item the root file
/// imports from a room, are found; the root file and what it defines are
/// free; an allowed arrow passes.
#[test]
fn the_room_check_finds_an_arrow_upwards() {
    assert_eq!(
        with(&[("db/pool.rs", "use super::replay::Job;\n")]),
        vec!["db/pool.rs: db::pool (room layer 3) -> db::replay (room layer 1) by super::replay::Job".to_owned()]
    );
    assert_eq!(
        with(&[("db/outbox.rs", "fn f() { crate::db::bookings::lock(); }\n")]),
        vec!["db/outbox.rs: db::outbox (room layer 2) -> db::bookings (room layer 2) by crate::db::bookings::lock".to_owned()],
        "its own layer"
    );
    assert_eq!(
        with(&[(
            "db/replay.rs",
            "use super::{DbError, bookings::headers};\nuse crate::db::outbox;\n"
        ), ("db/bookings.rs", "use super::{DbError, PgPool};\nuse super::replay::Job;\n")]),
        vec!["db/bookings.rs: db::bookings (room layer 2) -> db::replay (room layer 1) by super::replay::Job".to_owned()]
    );
    // `open` is the root's re-export of `pool::connect`: a use of `pool`,
    // which is below `bookings`; the same name from `pool` itself is its own.
    assert!(with(&[("db/pool.rs", "fn f() { super::open(); }\n")]).is_empty());
    assert_eq!(
        with(&[
            (
                "db/mod.rs",
                "mod bookings;\nmod outbox;\nmod pool;\nmod replay;\npub use replay::Job;\npub enum DbError {}\n"
            ),
            ("db/pool.rs", "use super::Job;\n")
        ]),
        vec![
            "db/pool.rs: db::pool (room layer 3) -> db::replay (room layer 1) by super::Job"
                .to_owned()
        ],
        "an item the root imports from a room"
    );
    assert!(
        with(&[("db/pool.rs", "use super::outbox::Row;\n")]).is_empty(),
        "the allowed arrow"
    );
}

#[test]
fn every_room_is_listed_and_every_listed_room_exists() {
    assert_eq!(
        with(&[("db/cache.rs", "")]),
        vec!["rooms of db: cache is in no layer of the list in src/lib.rs".to_owned()]
    );
    let mut files: Vec<(&str, &str)> = DB.to_vec();
    files.retain(|(path, _)| *path != "db/outbox.rs");
    assert_eq!(
        check(&files),
        vec!["rooms of db: outbox is listed but has no file".to_owned()]
    );
    // A room may be a folder of its own.
    assert!(with(&[("db/pool/mod.rs", "use super::DbError;\n")]).is_empty());
}

#[test]
fn use_trees_and_paths_are_read_whole() {
    let (paths, _) = tree_at("crate::{a::{b, c as d}, e, f::g::*};");
    assert_eq!(paths[1].name().map(String::as_str), Some("d"));
    let paths: Vec<String> = paths.iter().map(|p| p.segments.join("::")).collect();
    assert_eq!(
        paths,
        ["crate::a::b", "crate::a::c", "crate::e", "crate::f::g"]
    );
    let named = named_paths("fn f() { super::super::x::y(); $crate::m::n!(); }");
    let segments: Vec<String> = named.iter().map(|n| n.segments.join("::")).collect();
    assert_eq!(segments, ["super::super::x::y", "$crate::m::n"]);
    assert_eq!(module_path("outbox/kafka/mod.rs"), ["outbox", "kafka"]);
    assert_eq!(module_path("config.rs"), ["config"]);
}
