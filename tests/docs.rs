//! The lists in the docs hold against the code they describe.
//!
//! - docs/testing.md's table of integration modules names every module of
//!   `tests/it/main.rs`, and no other.
//! - The exit statuses listed in the README, docs/operations.md and the
//!   doc comment of `src/main.rs` are the ones the code returns: 0, the
//!   fallback of `src/main.rs`'s `fail`, and every arm of
//!   `AppError::exit_code` in `src/app.rs` (2 is also clap's usage error).
//! - The settings table and the "Ranges" table of docs/configuration.md
//!   against the settings' declarations (`src/config/catalog.rs`): each
//!   declared variable's row, default and range, each range's row.
//! - The settings table of docs/configuration.md against the binary's
//!   `--help` (every command's): each variable `--help` names (`[env: …]`)
//!   has a row and each row's variable is in `--help`, but for the few the
//!   binary reads outside its command line (`RUST_LOG`, `LOG_FORMAT`, the
//!   `OTEL_*` ones), which must be read where this file says; where
//!   `--help` shows a default the table shows the same (a switch's is
//!   `false`); where it shows none, the table names no value of its own
//!   unless the code sets one (`PGHOST`'s socket directory, ...), listed
//!   here with the file that sets it. The README's table of the five
//!   settings most people set is held to the same defaults.
//! - The README's headline figures are rows of the figures table that the
//!   bench's renderer (`benches/throughput/render.rs`) printed into
//!   docs/benchmarks.md, cell for cell, its last column (the machine's
//!   load) left out.
//!
//! It reads files and runs the binary's `--help` only, so it needs no
//! server: CI runs it in its first stage with the layering check (`cargo
//! test --locked --test docs`).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
};

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {}: {e}", full.display()))
}

/// The rows of the first Markdown table after the heading `heading`, as
/// cells (the header and separator rows left out).
fn table_after(page: &str, heading: &str) -> Vec<Vec<String>> {
    let start = page
        .lines()
        .position(|line| line.trim_end() == heading)
        .unwrap_or_else(|| panic!("no heading {heading:?}"));
    page.lines()
        .skip(start + 1)
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| {
            let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
            split_cells(inner)
        })
        .collect()
}

/// Splits a table row on `|`, except an escaped `\|` and one inside code.
fn split_cells(row: &str) -> Vec<String> {
    let (mut cells, mut cell, mut code, mut escaped) = (Vec::new(), String::new(), false, false);
    for c in row.chars() {
        match c {
            _ if escaped => {
                cell.push(c);
                escaped = false;
            }
            '\\' => {
                cell.push(c);
                escaped = true;
            }
            '`' => {
                cell.push(c);
                code = !code;
            }
            '|' if !code => cells.push(std::mem::take(&mut cell).trim().to_owned()),
            _ => cell.push(c),
        }
    }
    cells.push(cell.trim().to_owned());
    cells
}

/// The code spans of `text` (`` `a` `` → `a`).
fn code_spans(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn is_variable(name: &str) -> bool {
    name.len() > 1
        && name.starts_with(|c: char| c.is_ascii_uppercase())
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

// --- integration modules -------------------------------------------------------

#[test]
fn testing_md_lists_every_integration_module() {
    let declared: BTreeSet<String> = read("tests/it/main.rs")
        .lines()
        .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
        .filter(|name| *name != "support")
        .map(str::to_owned)
        .collect();
    assert!(
        declared.len() > 10,
        "modules of tests/it/main.rs: {declared:?}"
    );
    let listed: Vec<String> = table_after(&read("docs/testing.md"), "## The integration modules")
        .iter()
        .map(|cells| code_spans(&cells[0]).concat())
        .collect();
    let listed_set: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(
        listed.len(),
        listed_set.len(),
        "a module listed twice: {listed:?}"
    );
    let missing: Vec<_> = declared.difference(&listed_set).collect();
    let extra: Vec<_> = listed_set.difference(&declared).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/testing.md's module table: missing {missing:?}, not in tests/it/main.rs {extra:?}"
    );
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(
        listed, sorted,
        "docs/testing.md: keep the modules in alphabetical order"
    );
}

// --- exit statuses ---------------------------------------------------------------

/// The exit statuses the binary returns, read from the code.
fn exit_statuses_in_code() -> BTreeSet<u8> {
    let app = read("src/app.rs");
    let body_start = app
        .find("pub fn exit_code(&self) -> u8")
        .expect("AppError::exit_code in src/app.rs");
    let body = &app[body_start..];
    let body = &body[..body.find("\n    }\n").expect("the end of exit_code")];
    let mut codes: BTreeSet<u8> = body
        .split("=>")
        .skip(1)
        .map(|arm| {
            let digits: String = arm
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits
                .parse()
                .unwrap_or_else(|_| panic!("an arm of exit_code that is no number: {arm:?}"))
        })
        .collect();
    let main = read("src/main.rs");
    assert!(
        main.contains("ExitCode::SUCCESS"),
        "src/main.rs exits 0 on success"
    );
    codes.insert(0);
    let fallback = main
        .split("map_or(")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .expect("src/main.rs: fail's map_or(N, AppError::exit_code)");
    codes.insert(fallback);
    // clap's usage errors exit 2 too (bad configuration).
    assert!(main.contains("error.exit_code()"));
    codes
}

/// The statuses a sentence lists: the numbers in it, each followed by what
/// it means.
fn statuses_in(text: &str) -> BTreeSet<u8> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter_map(|word| word.parse::<u8>().ok())
        .collect()
}

/// The text from `marker` to the end of its paragraph.
fn paragraph_from<'a>(page: &'a str, marker: &str, file: &str) -> &'a str {
    let start = page
        .find(marker)
        .unwrap_or_else(|| panic!("{file}: no {marker:?}"));
    let rest = &page[start..];
    &rest[..rest.find("\n\n").unwrap_or(rest.len())]
}

#[test]
fn the_exit_statuses_listed_are_the_ones_the_code_returns() {
    let code = exit_statuses_in_code();
    assert_eq!(code, BTreeSet::from([0, 1, 2, 3, 70]), "read from the code");
    let readme = read("README.md");
    let operations = read("docs/operations.md");
    let main = read("src/main.rs");
    // Each page gives them in a paragraph of their own.
    let listed = [
        (
            "README.md",
            paragraph_from(&readme, "Exit status", "README.md").to_owned(),
        ),
        (
            "docs/operations.md",
            paragraph_from(&operations, "Exit status", "docs/operations.md").to_owned(),
        ),
        (
            "src/main.rs",
            paragraph_from(&main, "exit status (", "src/main.rs")
                .split(')')
                .next()
                .unwrap_or_default()
                .to_owned(),
        ),
    ];
    for (file, text) in listed {
        assert_eq!(
            statuses_in(&text),
            code,
            "{file} lists other exit statuses than the code returns: {text:?}"
        );
    }
}

// --- settings ------------------------------------------------------------------

/// One option of `--help` that has a variable.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HelpOption {
    variable: String,
    /// `[default: …]`, or `false` for a switch (an option without a value).
    default: Option<String>,
}

/// Every variable that `--help` of every command names, with its default.
fn help_options() -> BTreeMap<String, HelpOption> {
    let commands: [&[&str]; 7] = [
        &["migrate"],
        &["run"],
        &["once"],
        &["status"],
        &["outbox", "retry"],
        &["republish"],
        &["seed"],
    ];
    let mut options: BTreeMap<String, HelpOption> = BTreeMap::new();
    for command in commands {
        let output = Command::new(env!("CARGO_BIN_EXE_booking-expiration"))
            .args(command)
            .arg("--help")
            // No variable of the developer's shows up as `[env: NAME=value]`.
            .env_clear()
            .output()
            .expect("run the binary's --help");
        assert!(output.status.success(), "{command:?} --help");
        let help = String::from_utf8(output.stdout).expect("UTF-8 help");
        for option in parse_help(&help) {
            if let Some(seen) = options.get(&option.variable) {
                assert_eq!(
                    seen,
                    &option,
                    "{}: another default in `{}` --help",
                    option.variable,
                    command.join(" ")
                );
            }
            options.insert(option.variable.clone(), option);
        }
    }
    options
}

/// The options of one `--help` (clap's long help: the flag on its own line,
/// its text on the next ones, `[env: NAME=]` and `[default: X]` in it).
fn parse_help(help: &str) -> Vec<HelpOption> {
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("--") || trimmed.starts_with("-h,") {
            entries.push((trimmed.to_owned(), String::new()));
        } else if let Some((_, text)) = entries.last_mut() {
            text.push_str(trimmed);
            text.push(' ');
        }
    }
    entries
        .into_iter()
        .filter_map(|(flag, text)| {
            let env = text.split("[env: ").nth(1)?;
            let variable: String = env.chars().take_while(|c| *c != '=' && *c != ']').collect();
            let default = match text.split("[default: ").nth(1) {
                Some(rest) => Some(rest.split(']').next().unwrap_or_default().to_owned()),
                None if !flag.contains('<') => Some("false".to_owned()),
                None => None,
            };
            Some(HelpOption { variable, default })
        })
        .collect()
}

/// Variables the binary reads outside its command line: (variable, file
/// that reads it, what that file says).
const READ_OUTSIDE_THE_COMMAND_LINE: [(&str, &str, &str); 3] = [
    ("RUST_LOG", "src/telemetry/logging.rs", "RUST_LOG"),
    ("LOG_FORMAT", "src/telemetry/logging.rs", "\"LOG_FORMAT\""),
    (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "src/telemetry/trace.rs",
        "\"OTEL_EXPORTER_OTLP_ENDPOINT\"",
    ),
];

/// Defaults the code fills in where `--help` shows none (libpq's): the
/// variable, the table's value, the file that sets it and what it says.
const DEFAULTS_SET_IN_CODE: [(&str, &str, &str, &str); 3] = [
    (
        "PGHOST",
        "/var/run/postgresql",
        "src/libpq/pgpass.rs",
        "DEFAULT_SOCKET_DIR: &str = \"/var/run/postgresql\"",
    ),
    (
        "PGPORT",
        "5432",
        "src/libpq/pgpass.rs",
        "DEFAULT_PORT: u16 = 5432",
    ),
    (
        "PGAPPNAME",
        "booking-expiration",
        "src/db/pool.rs",
        "DEFAULT_APPLICATION_NAME: &str = \"booking-expiration\"",
    ),
];

/// A settings table: variable → its default cell (the part before the
/// range), one entry per variable of a row (`A` / `B` rows split).
fn settings_table(page: &str, heading: &str, file: &str) -> BTreeMap<String, String> {
    let mut table = BTreeMap::new();
    for cells in table_after(page, heading) {
        let variables: Vec<String> = code_spans(&cells[0])
            .into_iter()
            .filter(|name| is_variable(name))
            .collect();
        assert!(
            !variables.is_empty(),
            "{file}: a row without a variable: {cells:?}"
        );
        let default_cell = cells[1].split("; ").next().unwrap_or_default();
        let defaults: Vec<&str> = default_cell.split(" / ").collect();
        for (i, variable) in variables.iter().enumerate() {
            let default = if defaults.len() == variables.len() {
                defaults[i]
            } else {
                default_cell
            };
            let previous = table.insert(variable.clone(), default.trim().to_owned());
            assert!(previous.is_none(), "{file}: {variable} has two rows");
        }
    }
    table
}

/// A cell that is one code span and nothing else: the value it names.
fn literal(cell: &str) -> Option<&str> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!inner.contains('`')).then_some(inner)
}

/// `table`'s defaults against `--help`'s.
fn check_defaults(
    file: &str,
    table: &BTreeMap<String, String>,
    help: &BTreeMap<String, HelpOption>,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for (variable, cell) in table {
        let Some(option) = help.get(variable) else {
            continue;
        };
        match (&option.default, literal(cell)) {
            (Some(default), Some(value)) if value == default => {}
            (Some(default), _) => wrong.push(format!(
                "{file}: {variable}'s default is {cell:?}, --help says `{default}`"
            )),
            (None, None) => {}
            (None, Some(value)) => {
                match DEFAULTS_SET_IN_CODE
                    .iter()
                    .find(|(v, _, _, _)| v == variable)
                {
                    Some((_, expected, source, needle)) => {
                        if value != *expected {
                            wrong.push(format!(
                                "{file}: {variable}'s default {value:?}, not {expected:?}"
                            ));
                        }
                        if !read(source).contains(needle) {
                            wrong.push(format!("{source} does not say {needle:?}"));
                        }
                    }
                    None => wrong.push(format!(
                        "{file}: {variable}'s default is {cell:?}, but --help shows none \
                         (say what unset means, or list the code's default in tests/docs.rs)"
                    )),
                }
            }
        }
    }
    wrong
}

#[test]
fn the_settings_table_matches_help() {
    let help = help_options();
    assert!(help.len() > 40, "variables in --help: {help:?}");
    let page = read("docs/configuration.md");
    let table = settings_table(&page, "## Settings", "docs/configuration.md");

    let in_help: BTreeSet<&String> = help.keys().collect();
    let in_table: BTreeSet<&String> = table.keys().collect();
    let missing: Vec<_> = in_help.difference(&in_table).collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md's settings table has no row for {missing:?}"
    );
    let outside: Vec<&&String> = in_table.difference(&in_help).collect();
    for variable in &outside {
        let Some((_, source, needle)) = READ_OUTSIDE_THE_COMMAND_LINE
            .iter()
            .find(|(v, _, _)| v == &variable.as_str())
        else {
            panic!("docs/configuration.md lists {variable}, which no --help names");
        };
        assert!(
            read(source).contains(needle),
            "{variable} is documented as read by {source}, which does not say {needle}"
        );
    }

    let mut wrong = check_defaults("docs/configuration.md", &table, &help);
    let readme = settings_table(
        &read("README.md"),
        "## The five settings most people set",
        "README.md",
    );
    for variable in readme.keys() {
        assert!(
            table.contains_key(variable),
            "README.md's five settings: {variable} is not in docs/configuration.md"
        );
    }
    wrong.extend(check_defaults("README.md", &readme, &help));
    assert!(wrong.is_empty(), "defaults:\n{}", wrong.join("\n"));
}

// --- headline figures --------------------------------------------------------------

/// The header cells of the first Markdown table after the heading `heading`.
fn header_after(page: &str, heading: &str) -> Vec<String> {
    let start = page
        .lines()
        .position(|line| line.trim_end() == heading)
        .unwrap_or_else(|| panic!("no heading {heading:?}"));
    let line = page
        .lines()
        .skip(start + 1)
        .find(|line| line.starts_with('|'))
        .unwrap_or_else(|| panic!("no table after {heading:?}"));
    split_cells(line.trim().trim_start_matches('|').trim_end_matches('|'))
}

#[test]
fn the_readme_figures_are_rows_the_bench_printed() {
    let readme = read("README.md");
    let benchmarks = read("docs/benchmarks.md");
    // The figures table of the run, as render.rs prints it.
    let printed_header = header_after(&benchmarks, "## The run");
    assert_eq!(
        printed_header.last().map(String::as_str),
        Some("load 1/5/15"),
        "docs/benchmarks.md's figures table: {printed_header:?}"
    );
    let columns = printed_header.len() - 1;
    let printed: Vec<Vec<String>> = table_after(&benchmarks, "## The run")
        .into_iter()
        .map(|cells| cells[..columns.min(cells.len())].to_vec())
        .collect();
    assert_eq!(
        header_after(&readme, "## Headline figures"),
        printed_header[..columns],
        "README.md's headline figures: the columns of docs/benchmarks.md's table but its last"
    );
    let quoted = table_after(&readme, "## Headline figures");
    assert!(
        quoted.len() >= 5,
        "README.md's headline figures: {quoted:?}"
    );
    let missing: Vec<String> = quoted
        .iter()
        .filter(|row| !printed.contains(row))
        .map(|row| row.join(" | "))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md's headline figures that are no row of docs/benchmarks.md's figures table \
         (copy the row as the bench printed it, without the load column):\n{}",
        missing.join("\n")
    );
}

/// docs/configuration.md against the settings' declarations
/// (`src/config/catalog.rs`): every declared variable has a row in the
/// settings table with its declared default and range, every range has a
/// row in "Ranges", and every variable of the table is declared (or read
/// outside the command line).
#[test]
fn the_configuration_page_matches_the_declarations() {
    use booking_expiration::config::catalog;
    let page = read("docs/configuration.md");
    let table = settings_table(&page, "## Settings", "docs/configuration.md");
    let ranges: Vec<Vec<String>> = table_after(&page, "## Ranges");
    let mut wrong = Vec::new();
    for setting in catalog::ALL {
        let range = setting.range_text();
        if let Some(variable) = setting.variable() {
            let Some(cell) = table.get(variable) else {
                wrong.push(format!("{variable}: no row in the settings table"));
                continue;
            };
            if let Some(default) = setting.default_text()
                && literal(cell) != Some(default.as_str())
            {
                wrong.push(format!(
                    "{variable}: the table's default is {cell:?}, declared `{default}`"
                ));
            }
        }
        let Some(range) = range else { continue };
        let name = format!("`{}`", setting.name());
        let rows: Vec<&Vec<String>> = ranges
            .iter()
            .filter(|cells| cells[0].contains(&name))
            .collect();
        match rows.as_slice() {
            [row] if row[1].starts_with(&range) => {}
            _ => wrong.push(format!(
                "{}: \"Ranges\" needs one row saying {range:?}, has {rows:?}",
                setting.name()
            )),
        }
        if let Some(variable) = setting.variable() {
            let rows = table_after(&page, "## Settings");
            let row = rows
                .iter()
                .find(|cells| code_spans(&cells[0]).iter().any(|c| c == variable));
            if !row.is_some_and(|cells| cells[1].contains(&range)) {
                wrong.push(format!(
                    "{variable}: the settings table does not say {range:?}"
                ));
            }
        }
    }
    let declared: BTreeSet<&str> = catalog::ALL.iter().filter_map(|s| s.variable()).collect();
    for variable in table.keys() {
        let outside = READ_OUTSIDE_THE_COMMAND_LINE
            .iter()
            .any(|(v, _, _)| v == variable);
        if !declared.contains(variable.as_str()) && !outside {
            wrong.push(format!("{variable}: in the table, declared nowhere"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md:\n{}",
        wrong.join("\n")
    );
}

// --- the checks' own parsers -----------------------------------------------------

#[test]
fn help_is_read_as_clap_prints_it() {
    let help = "Options:\n      --a <A>\n          Text; 1 to 2 [env: A_B=] [default: 5s]\n      \
                --flag\n          A switch [env: FLAG=]\n      --url <URL>\n          \
                The URL [env: URL]\n  -h, --help\n          Print help\n";
    assert_eq!(
        parse_help(help),
        vec![
            HelpOption {
                variable: "A_B".into(),
                default: Some("5s".into())
            },
            HelpOption {
                variable: "FLAG".into(),
                default: Some("false".into())
            },
            HelpOption {
                variable: "URL".into(),
                default: None
            },
        ]
    );
}

#[test]
fn tables_are_read_with_code_and_paired_defaults() {
    let page = "## T\n\n| v | d | m |\n|---|---|---|\n| `A_X` / `B_X` | `3` / `1`; 1 to 2 / 1 to 3 | x `a|b` |\n\
                | `C_X`, `D_X` | as the parameters | |\n| `OTEL_X` and `OTEL_*` | unset | |\n";
    let table = settings_table(page, "## T", "test");
    assert_eq!(table["A_X"], "`3`");
    assert_eq!(table["B_X"], "`1`");
    assert_eq!(table["C_X"], "as the parameters");
    assert_eq!(table["D_X"], "as the parameters");
    assert_eq!(table["OTEL_X"], "unset");
    assert_eq!(table.len(), 5);
    assert_eq!(
        split_cells(" a | `x|y` | c\\|d "),
        vec!["a", "`x|y`", "c\\|d"]
    );
    assert_eq!(literal("`5s`"), Some("5s"));
    assert_eq!(literal("`~/.pgpass` (`$HOME/.pgpass`)"), None);
    assert_eq!(
        statuses_in("Exit status: 0 success, 3 pending (`migrate --check`)"),
        BTreeSet::from([0, 3])
    );
}
