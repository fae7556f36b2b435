//! The crate's layering, as `src/lib.rs` documents it, holds in the code:
//! every `crate::` path outside the test modules points to a module of a
//! lower layer.

use std::{collections::BTreeMap, path::Path};

/// The numbered list under `# Layers` in the crate docs: module → layer
/// (1 is the top).
fn documented_layers(lib: &str) -> BTreeMap<String, usize> {
    let mut layers = BTreeMap::new();
    let mut inside = false;
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let doc = doc.trim();
        if doc.starts_with('#') {
            inside = doc == "# Layers";
            continue;
        }
        let Some((number, names)) = doc.split_once(". ") else {
            continue;
        };
        let Ok(number) = number.parse::<usize>() else {
            continue;
        };
        if inside {
            for name in names.split(", ") {
                let name = name.trim_matches(|c| matches!(c, '[' | ']' | '`'));
                layers.insert(name.to_owned(), number);
            }
        }
    }
    layers
}

/// The top-level modules `crate::` paths in `source` name, outside
/// comments and outside a `#[cfg(test)]` module (which runs to the end of
/// its file, as every test module here does).
fn imported_modules(source: &str) -> Vec<String> {
    let mut code = String::new();
    let mut lines = source.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.split_whitespace().any(|word| word == "mod"))
        {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        code.push_str(line);
        code.push('\n');
    }
    let mut modules = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        // `$crate::` in a macro is the same crate too.
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::b, c}`: the first name of each top-level item.
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        rest = &group[i..];
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_ascii_alphabetic() || c == '_') => {
                        item_start = false;
                        modules.push(identifier(&group[i..]));
                    }
                    _ => {}
                }
            }
        } else {
            modules.push(identifier(rest));
        }
    }
    modules
}

fn identifier(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// `path` (relative to `src/`) → its top-level module.
fn module_of(path: &Path) -> String {
    let first = path.components().next().expect("a path under src/");
    let name = first.as_os_str().to_string_lossy();
    name.strip_suffix(".rs").unwrap_or(&name).to_owned()
}

/// Every arrow against the layers: "file: module (layer n) -> module (layer m)".
fn violations(layers: &BTreeMap<String, usize>, files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, source) in files {
        let from = module_of(Path::new(path));
        let Some(&from_layer) = layers.get(&from) else {
            found.push(format!(
                "{path}: module {from} is in no layer of the crate docs"
            ));
            continue;
        };
        for to in imported_modules(source) {
            if to == from {
                continue;
            }
            match layers.get(&to) {
                Some(&to_layer) if to_layer > from_layer => {}
                Some(&to_layer) => found.push(format!(
                    "{path}: {from} (layer {from_layer}) -> {to} (layer {to_layer})"
                )),
                None => found.push(format!("{path}: {from} -> {to}, which is in no layer")),
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

fn sources(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).expect("under src/");
            let relative = relative.to_string_lossy().into_owned();
            if relative != "lib.rs" && relative != "main.rs" {
                let text = std::fs::read_to_string(&path).expect("read a source file");
                out.push((relative, text));
            }
        }
    }
}

#[test]
fn every_import_follows_the_layers_the_crate_docs_list() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read src/lib.rs");
    let layers = documented_layers(&lib);
    let declared: Vec<String> = lib
        .lines()
        .filter_map(|line| line.strip_prefix("pub mod "))
        .map(|name| name.trim_end_matches(';').to_owned())
        .collect();
    assert!(declared.len() >= 10, "the modules of lib.rs: {declared:?}");
    for module in &declared {
        assert!(
            layers.contains_key(module),
            "module {module} is in no layer of lib.rs's `# Layers` list: {layers:?}"
        );
    }
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    assert!(files.len() > 40, "the source files: {}", files.len());
    let found = violations(&layers, &files);
    assert!(
        found.is_empty(),
        "imports against the layers of src/lib.rs:\n{}",
        found.join("\n")
    );
}

/// The check sees arrows in every form the code writes them, and not in
/// comments or test modules.
#[test]
fn the_layering_check_finds_an_arrow_upwards() {
    let layers = documented_layers(
        "//! # Layers\n//!\n//! 1. [`app`]\n//! 2. [`db`], [`telemetry`]\n//! 3. [`config`]\n//!\n//! # Other\n//! 4. [`ignored`]\n",
    );
    assert_eq!(layers.len(), 4, "{layers:?}");
    assert!(!layers.contains_key("ignored"));
    let file = |path: &str, text: &str| vec![(path.to_owned(), text.to_owned())];
    let upwards =
        "use crate::{\n    config::X,\n    db::{pool::P, Q},\n};\nfn f() { crate::app::run(); }\n";
    assert_eq!(
        violations(&layers, &file("db/pool.rs", upwards)),
        vec!["db/pool.rs: db (layer 2) -> app (layer 1)".to_owned()]
    );
    assert_eq!(
        violations(&layers, &file("telemetry.rs", "use crate::db::PgPool;\n")),
        vec!["telemetry.rs: telemetry (layer 2) -> db (layer 2)".to_owned()],
        "its own layer"
    );
    let quiet = "// crate::app::x\n/// [`crate::app`]\nuse crate::config;\n#[cfg(test)]\nmod tests {\n    use crate::app::y;\n}\n";
    assert!(violations(&layers, &file("db.rs", quiet)).is_empty());
    assert_eq!(
        violations(&layers, &file("config/parse.rs", "use crate::nowhere;\n")),
        vec!["config/parse.rs: config -> nowhere, which is in no layer".to_owned()]
    );
}
