//! docs/REFERENCE.md held to the code: its `ringstore serve` flag table must list every
//! visible key of `ringstore_config::KEYS` (and `--config`), no other, each with the code's
//! default and its allowed values exactly as the parser's errors say them.

use ringstore_config::{Config, KEYS};
use std::collections::BTreeMap;

/// The page, from the repository root.
const PAGE: &str = "docs/REFERENCE.md";

/// Keys that are unset by default, whose default cell says `none` (no value spells "unset":
/// `--data-size`, `--hostname` and the TLS paths take only real values).
const UNSET_BY_DEFAULT: [&str; 6] = [
    "config",
    "data-size",
    "hostname",
    "tls-cert",
    "tls-key",
    "tls-ca",
];

/// One row of the flag table: the default cell and the values cell, by flag name.
#[derive(Debug)]
struct Row {
    default: String,
    values: String,
}

/// Splits a table line on the `|` that are not escaped as `\|`, unescaping the others.
fn cells(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cell = String::new();
    let mut chars = line.trim().trim_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => out.push(std::mem::take(&mut cell)),
            c => cell.push(c),
        }
    }
    out.push(cell);
    out.into_iter().map(|s| s.trim().to_string()).collect()
}

/// The rows of `text`'s flag table (lines `| \`--NAME ...\` | ...`), by flag name.
fn flag_rows(text: &str) -> BTreeMap<String, Row> {
    let mut rows = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| `--")) {
        let c = cells(line);
        let name: String = c[0]["`--".len()..]
            .chars()
            .take_while(|ch| ch.is_ascii_alphanumeric() || *ch == '-')
            .collect();
        let row = Row {
            default: c.get(1).cloned().unwrap_or_default(),
            values: c.get(2).cloned().unwrap_or_default(),
        };
        assert!(rows.insert(name.clone(), row).is_none(), "--{name} twice");
    }
    rows
}

/// The first `backticked` word of a cell.
fn first_code(cell: &str) -> Option<&str> {
    let rest = cell.split_once('`')?.1;
    Some(rest.split_once('`')?.0)
}

/// Every mismatch between `text`'s flag table and the code's, one line each.
fn mismatches(text: &str) -> Vec<String> {
    let rows = flag_rows(text);
    let mut wrong = Vec::new();
    let visible: Vec<&str> = KEYS
        .iter()
        .filter(|k| !k.hidden)
        .map(|k| k.name)
        .chain(["config"])
        .collect();
    for name in &visible {
        if !rows.contains_key(*name) {
            wrong.push(format!("--{name} is missing from the flag table"));
        }
    }
    for name in rows.keys().filter(|n| !visible.contains(&n.as_str())) {
        wrong.push(format!(
            "--{name} is in the flag table but not a serve flag"
        ));
    }
    for key in KEYS.iter().filter(|k| !k.hidden) {
        let Some(row) = rows.get(key.name) else {
            continue;
        };
        if row.values != key.expected {
            wrong.push(format!(
                "--{}: values {:?}, the code says {:?}",
                key.name, row.values, key.expected
            ));
        }
        wrong.extend(default_mismatch(key.name, &row.default));
    }
    wrong
}

/// Whether `cell` states `name`'s default: its first `value`, applied to the defaults, changes
/// nothing; or `none` for a key that is unset by default.
fn default_mismatch(name: &str, cell: &str) -> Option<String> {
    let Some(value) = first_code(cell) else {
        return (!(cell.starts_with("none") && UNSET_BY_DEFAULT.contains(&name)))
            .then(|| format!("--{name}: default {cell:?} is not a `value`"));
    };
    let mut config = Config::default();
    match config.set(name, value) {
        Ok(()) if config == Config::default() => None,
        Ok(()) => Some(format!(
            "--{name}: default `{value}` is not the code's default"
        )),
        Err(e) => Some(format!("--{name}: default `{value}` is refused: {e}")),
    }
}

#[test]
fn the_reference_flag_table_is_the_code_s() {
    let text = std::fs::read_to_string(crate::util::root().join(PAGE)).unwrap();
    let wrong = mismatches(&text);
    assert!(wrong.is_empty(), "{PAGE}:\n{}", wrong.join("\n"));
}

/// The check catches what it is for: a flag left out, a wrong default, wrong values.
#[test]
fn a_missing_flag_or_a_wrong_default_is_caught() {
    let text = std::fs::read_to_string(crate::util::root().join(PAGE)).unwrap();
    let without: String = text
        .lines()
        .filter(|l| !l.starts_with("| `--max-conns "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        mismatches(&without),
        ["--max-conns is missing from the flag table"]
    );
    let wrong_default = text.replace(
        "| `--memory SIZE` | `64MiB` |",
        "| `--memory SIZE` | `1GiB` |",
    );
    assert_eq!(
        mismatches(&wrong_default),
        ["--memory: default `1GiB` is not the code's default"]
    );
    let wrong_values = text.replace("| auto, io_uring or epoll |", "| auto or epoll |");
    assert_eq!(mismatches(&wrong_values).len(), 1);
    assert_eq!(
        default_mismatch("hostname", "the system's").as_deref(),
        Some("--hostname: default \"the system's\" is not a `value`")
    );
}

#[test]
fn table_cells_keep_escaped_bars() {
    assert_eq!(
        cells(r"| `--io auto\|epoll` | `auto` | a \| b |"),
        ["`--io auto|epoll`", "`auto`", "a | b"]
    );
}

/// ARCHITECTURE.md and BENCHMARKS.md state the present (issue 37): short enough to be read
/// whole and kept true; history is in git, not appended to them.
#[test]
fn the_architecture_and_benchmarks_pages_stay_short() {
    for (page, max_chars) in [
        ("docs/ARCHITECTURE.md", 20_000),
        ("docs/BENCHMARKS.md", 40_000),
    ] {
        let text = std::fs::read_to_string(crate::util::root().join(page)).unwrap();
        let chars = text.chars().count();
        assert!(
            chars <= max_chars,
            "{page}: {chars} characters, the bound is {max_chars}"
        );
    }
}
