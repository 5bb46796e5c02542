//! Tests of the tree's shape. Inside each crate (the product crates, xtask and the QEMU
//! tests, tests/vm), no two modules under the same parent import each other, directly or
//! around a longer circle, except the circles listed in [`ALLOWED`], each with its reason
//! there (issue 21; issue 37 extended it from the top level to every folder). Between crates,
//! ADR-0000's dependency table is what each crate's `Cargo.toml` declares (issue 37). In
//! the runtime, a step of a connection's lifecycle is defined in at most one module of
//! `src/engine/` (ADR 0040): a second definition is a second lifecycle starting.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    /// (crate, parent module path, circle as its modules): circles kept on purpose.
    /// Empty: the last two (tests/vm's TLS tests and their harness) were broken by the
    /// shared client in `tls_client.rs`; an entry needs its reason beside it.
    const ALLOWED: &[(&str, &str, &[&str])] = &[];

    /// Per parent module path (`""` for the crate root, `"console"`, …): its children's
    /// imports of each other.
    type Graphs = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The module path of a file (`console/commands.rs` → `[console, commands]`, `mod.rs`
    /// → its folder); `None` for test files (`tests.rs`, `*_tests.rs`, `testing.rs`, under
    /// `tests/`), which may import anything.
    fn module_path(src: &Path, file: &Path) -> Option<Vec<String>> {
        let rel = file.strip_prefix(src).ok()?.with_extension("");
        let mut path: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let stem = path.last()?;
        let test_file = stem == "tests" || stem == "testing" || stem.ends_with("_tests");
        if test_file || path.iter().any(|p| p == "tests") {
            return None;
        }
        let root = path.len() == 1 && ["lib", "main"].contains(&path[0].as_str());
        if root || path.last()? == "mod" {
            path.pop();
        }
        Some(path)
    }

    /// The code of a file: comment lines and everything from the first `#[cfg(test)]` out.
    fn code(text: &str) -> String {
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let lines = code.lines().filter(|l| !l.trim_start().starts_with("//"));
        lines.collect::<Vec<_>>().join("\n")
    }

    /// The identifier at the start of `s`.
    fn ident(s: &str) -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    }

    /// Absolute module paths (first segment after the anchor, and the next one) that `code`
    /// names through `crate::`, `super::` or `self::`, seen from the file at `at`. A brace
    /// group (`super::{a::A, b}`) gives each of its members.
    fn imports(code: &str, at: &[String]) -> BTreeSet<Vec<String>> {
        let mut out = BTreeSet::new();
        for anchor in ["crate::", "super::", "self::"] {
            for (pos, _) in code.match_indices(anchor) {
                let before = code[..pos].chars().next_back();
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                    continue; // `super::super::x` is read from its first `super`.
                }
                let mut base: Vec<String> = match anchor {
                    "crate::" => Vec::new(),
                    "self::" => at.to_vec(),
                    _ => at[..at.len().saturating_sub(1)].to_vec(),
                };
                let mut rest = &code[pos + anchor.len()..];
                while let Some(r) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = r;
                }
                for member in members(rest) {
                    let mut path = base.clone();
                    path.extend(member);
                    out.insert(path);
                }
            }
        }
        out
    }

    /// The first two segments of the path at the start of `rest`, or of each member of a
    /// brace group there.
    fn members(rest: &str) -> Vec<Vec<String>> {
        let group = |s: &str| -> Vec<String> {
            let first = ident(s);
            let second = s[first.len()..].strip_prefix("::").map(ident);
            [Some(first), second]
                .into_iter()
                .flatten()
                .filter(|n| !n.is_empty())
                .collect()
        };
        let Some(inner) = rest.strip_prefix('{') else {
            return vec![group(rest)];
        };
        let end = inner.find('}').unwrap_or(inner.len());
        inner[..end]
            .split(',')
            .map(|m| group(m.trim()))
            .filter(|g| !g.is_empty())
            .collect()
    }

    /// Every import between two children of the same parent, by parent.
    fn graphs(src: &Path) -> Graphs {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        let mut graphs = Graphs::new();
        for file in files {
            let Some(from) = module_path(src, &file) else {
                continue;
            };
            let text = code(&std::fs::read_to_string(&file).unwrap());
            for to in imports(&text, &from) {
                let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
                let (Some(a), Some(b)) = (from.get(common), to.get(common)) else {
                    continue;
                };
                let parent = from[..common].join("::");
                let graph = graphs.entry(parent).or_default();
                graph.entry(a.clone()).or_default().insert(b.clone());
            }
        }
        graphs
    }

    /// Every module set that lies on a circle, as its members sorted.
    fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
        let mut found = BTreeSet::new();
        for start in graph.keys() {
            let mut stack = vec![(start.clone(), vec![start.clone()])];
            while let Some((at, path)) = stack.pop() {
                for next in graph.get(&at).into_iter().flatten() {
                    if next == start {
                        let mut members = path.clone();
                        members.sort();
                        found.insert(members);
                    } else if !path.contains(next) && path.len() < 8 {
                        let mut longer = path.clone();
                        longer.push(next.clone());
                        stack.push((next.clone(), longer));
                    }
                }
            }
        }
        found
    }

    /// The circles of crate `krate` (source folder `src`) that [`ALLOWED`] does not list.
    fn unexplained(krate: &str, src: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for (parent, graph) in graphs(src) {
            for circle in circles(&graph) {
                let allowed = ALLOWED.iter().any(|(c, p, members)| {
                    let mut m: Vec<String> = members.iter().map(|s| s.to_string()).collect();
                    m.sort();
                    *c == krate && *p == parent && m == circle
                });
                if !allowed {
                    let at = if parent.is_empty() {
                        String::new()
                    } else {
                        format!("{parent}::")
                    };
                    out.push(format!("{krate}: {at}{{{}}}", circle.join(" <-> ")));
                }
            }
        }
        out
    }

    #[test]
    fn no_module_imports_its_importer_inside_a_crate() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut crates = vec![
            ("xtask".to_string(), root.join("xtask/src")),
            ("vm".to_string(), root.join("tests/vm/src")),
        ];
        for entry in std::fs::read_dir(root.join("appliance")).unwrap().flatten() {
            let krate = entry.file_name().to_string_lossy().into_owned();
            crates.push((krate, entry.path().join("src")));
        }
        let mut found = Vec::new();
        for (krate, src) in crates.iter().filter(|(_, src)| src.is_dir()) {
            found.extend(unexplained(krate, src));
        }
        assert!(found.is_empty(), "import circles inside a crate: {found:?}");
    }

    #[test]
    fn the_circle_finder_finds_a_planted_circle() {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        g.entry("a".into()).or_default().insert("b".into());
        g.entry("b".into()).or_default().insert("c".into());
        g.entry("c".into()).or_default().insert("a".into());
        g.entry("d".into()).or_default().insert("a".into());
        let found = circles(&g);
        assert_eq!(found.len(), 1);
        assert!(found.contains(&vec!["a".into(), "b".into(), "c".into()]));
        let at = ["console".to_string(), "certs".to_string()];
        let text = "use crate::state::State;\nfn f() { crate::plane::go() }\n\
                    use super::{commands::Ctx, output};\nuse super::super::log;";
        let names: Vec<String> = imports(&code(text), &at)
            .into_iter()
            .map(|p| p.join("::"))
            .collect();
        assert_eq!(
            names,
            [
                "console::commands::Ctx",
                "console::output",
                "log",
                "plane::go",
                "state::State"
            ]
        );
    }

    #[test]
    fn a_circle_between_two_files_of_a_folder_is_found() {
        let dir = std::env::temp_dir().join(format!("layering-{}", std::process::id()));
        let console = dir.join("console");
        std::fs::create_dir_all(&console).unwrap();
        std::fs::write(dir.join("lib.rs"), "mod console;").unwrap();
        std::fs::write(console.join("mod.rs"), "mod certs;\nmod commands;").unwrap();
        std::fs::write(console.join("certs.rs"), "use super::commands::Ctx;").unwrap();
        std::fs::write(
            console.join("commands.rs"),
            "fn f() { super::certs::run() }",
        )
        .unwrap();
        let found = unexplained("planted", &dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found, ["planted: console::{certs <-> commands}"]);
    }

    /// ADR-0000's table: crate cell → (normal dependencies, dev-only dependencies), each by
    /// its name without the `ringstore-` prefix.
    type Table = BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>;

    /// Splits a "depends on" cell at the commas outside parentheses.
    fn cell_items(cell: &str) -> Vec<String> {
        let (mut items, mut item, mut depth) = (Vec::new(), String::new(), 0);
        for c in cell.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(std::mem::take(&mut item));
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        items.push(item);
        items.into_iter().map(|i| i.trim().to_string()).collect()
    }

    fn parse_table(adr: &str) -> Table {
        let mut table = Table::new();
        for line in adr.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = line.split(" | ").collect();
            let name = cells[0].trim_start_matches("| `");
            let name = name[..name.find('`').unwrap()].to_string();
            let (mut normal, mut dev) = (BTreeSet::new(), BTreeSet::new());
            for item in cell_items(cells[2]) {
                let dep = item.split([' ', '(']).next().unwrap().to_string();
                let dep = dep.trim_start_matches("ringstore-").to_string();
                let set = if item.contains("(dev)") {
                    &mut dev
                } else {
                    &mut normal
                };
                set.insert(dep);
            }
            table.insert(name, (normal, dev));
        }
        table
    }

    /// A manifest's dependencies as the table names them (`thiserror` left out), and its
    /// dev-dependencies that are not also normal ones.
    fn manifest_deps(manifest: &str) -> (BTreeSet<String>, BTreeSet<String>) {
        let doc: toml::Table = manifest.parse().unwrap();
        let names = |key: &str| -> BTreeSet<String> {
            let section = doc.get(key).and_then(|d| d.as_table());
            let keys = section.into_iter().flat_map(|t| t.keys());
            keys.map(|k| k.trim_start_matches("ringstore-").to_string())
                .filter(|k| k != "thiserror")
                .collect()
        };
        let normal = names("dependencies");
        let dev = names("dev-dependencies");
        (normal.clone(), dev.difference(&normal).cloned().collect())
    }

    /// Where each crate the table may name lives: package name → manifest, and `fuzz/`.
    fn manifests(root: &Path) -> BTreeMap<String, PathBuf> {
        let mut out = BTreeMap::new();
        out.insert("fuzz/".to_string(), root.join("fuzz/Cargo.toml"));
        let mut dirs = vec![
            root.join("xtask"),
            root.join("tests/bench"),
            root.join("tests/support"),
            root.join("tests/vm"),
        ];
        for entry in std::fs::read_dir(root.join("appliance")).unwrap().flatten() {
            dirs.push(entry.path());
        }
        for manifest in dirs.iter().map(|d| d.join("Cargo.toml")) {
            let Ok(text) = std::fs::read_to_string(&manifest) else {
                continue;
            };
            let doc: toml::Table = text.parse().unwrap();
            let name = doc["package"]["name"].as_str().unwrap().to_string();
            out.insert(name, manifest);
        }
        out
    }

    /// Each difference between the table and the manifests, as a line.
    fn differences(table: &Table, manifests: &BTreeMap<String, PathBuf>) -> Vec<String> {
        let mut out = Vec::new();
        for (name, manifest) in manifests {
            let Some((normal, dev)) = table.get(name) else {
                out.push(format!("{name}: no row in the table"));
                continue;
            };
            let (declared, declared_dev) =
                manifest_deps(&std::fs::read_to_string(manifest).unwrap());
            for (what, listed, actual) in [("", normal, &declared), (" (dev)", dev, &declared_dev)]
            {
                let actual: BTreeSet<String> = if what.is_empty() {
                    actual.clone()
                } else {
                    // Dev-dependencies: every one the table lists, and every ringstore crate.
                    let ours = |d: &&String| {
                        listed.contains(*d) || manifests.contains_key(&format!("ringstore-{d}"))
                    };
                    actual.iter().filter(ours).cloned().collect()
                };
                for missing in actual.difference(listed) {
                    out.push(format!("{name}: the table lacks {missing}{what}"));
                }
                for extra in listed.difference(&actual) {
                    out.push(format!(
                        "{name}: the table lists {extra}{what}, Cargo.toml does not"
                    ));
                }
            }
        }
        for name in table.keys().filter(|n| !manifests.contains_key(*n)) {
            out.push(format!("{name}: a row for no crate"));
        }
        out
    }

    fn adr_0000(root: &Path) -> String {
        let adr = root.join("docs/adr/0000-crate-layout.md");
        std::fs::read_to_string(adr).unwrap()
    }

    #[test]
    fn adr_0000_names_each_crates_dependencies() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let table = parse_table(&adr_0000(&root));
        let found = differences(&table, &manifests(&root));
        assert!(
            found.is_empty(),
            "ADR-0000's table differs from Cargo.toml: {found:#?}"
        );
    }

    #[test]
    fn a_dependency_missing_from_the_table_is_found() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let adr = adr_0000(&root);
        let row = adr
            .lines()
            .find(|l| l.starts_with("| `ringstore-durable`"))
            .unwrap();
        let planted = adr.replace(row, &row.replacen("store, ", "", 1));
        let found = differences(&parse_table(&planted), &manifests(&root));
        assert_eq!(found, ["ringstore-durable: the table lacks store"]);
        let row = "| `x` | - | proto, tls (dev), rustls (the `ring` provider, TLS 1.3) | - |";
        let (normal, dev) = &parse_table(row)["x"];
        assert_eq!(normal.iter().collect::<Vec<_>>(), ["proto", "rustls"]);
        assert_eq!(dev.iter().collect::<Vec<_>>(), ["tls"]);
    }

    /// Steps of a connection's lifecycle besides the machine's own inputs and outputs
    /// (`handle_*`, `poll_*`, read from `connection/machine.rs`): the ones both engines
    /// once wrote themselves (ADR 0040, issue 37), now in `engine/worker.rs` once.
    const LIFECYCLE_STEPS: &[&str] = &[
        "open_connection",
        "close",
        "finish_close",
        "begin_stop",
        "on_tick",
        "poll_output",
        "take_inbox",
        "check_timeouts",
        "closed_by_tick",
        "linger",
        "start_linger",
        "forget_connection",
        "settle_sessions",
        "bytes_sent",
        "output_flushed",
    ];

    /// Steps both engines may still define, each with its reason. Empty since the shared
    /// steps moved to `engine/worker.rs` (the engines supply only I/O hooks there); an entry
    /// that is no longer defined twice fails the test, so the list cannot grow stale.
    const TWICE: &[(&str, &str)] = &[];

    /// The names of the functions `code` defines.
    fn defined_fns(code: &str) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for (pos, _) in code.match_indices("fn ") {
            let before = code[..pos].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let name = ident(&code[pos + 3..]);
            if !name.is_empty() {
                names.insert(name);
            }
        }
        names
    }

    /// The connection machine's inputs and outputs: its `handle_*` and `poll_*` functions.
    fn machine_steps(machine: &str) -> Vec<String> {
        defined_fns(&code(machine))
            .into_iter()
            .filter(|n| n.starts_with("handle_") || n.starts_with("poll_"))
            .collect()
    }

    /// Each of `steps` defined in more than one module of the engines (the files under
    /// `engine`, and `engine.rs` beside it), as "step: module, module", unless `twice`
    /// names it.
    fn lifecycle_duplicates(engine: &Path, steps: &[String], twice: &[&str]) -> Vec<String> {
        let mut files = Vec::new();
        rust_files(engine, &mut files);
        let parent = engine.with_extension("rs");
        if parent.is_file() {
            files.push(parent);
        }
        let mut defined: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for file in &files {
            let name = file.file_name().unwrap_or_default().to_string_lossy();
            if name == "tests.rs" || name.ends_with("_tests.rs") {
                continue;
            }
            let fns = defined_fns(&code(&std::fs::read_to_string(file).unwrap()));
            let module = file
                .strip_prefix(engine.parent().unwrap_or(engine))
                .unwrap();
            for step in steps.iter().filter(|s| fns.contains(*s)) {
                let modules = defined.entry(step.as_str()).or_default();
                modules.insert(module.display().to_string());
            }
        }
        defined
            .into_iter()
            .filter(|(step, modules)| modules.len() > 1 && !twice.contains(step))
            .map(|(step, modules)| {
                let modules: Vec<String> = modules.into_iter().collect();
                format!("{step}: {}", modules.join(", "))
            })
            .collect()
    }

    #[test]
    fn no_lifecycle_step_is_defined_twice_in_the_engines() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../appliance/runtime/src");
        let machine = std::fs::read_to_string(src.join("connection/machine.rs")).unwrap();
        let mut steps = machine_steps(&machine);
        assert!(
            steps.len() >= 8 && steps.iter().any(|s| s == "handle_served"),
            "the machine's handle_*/poll_* were not found: {steps:?}"
        );
        steps.extend(LIFECYCLE_STEPS.iter().map(|s| s.to_string()));
        let twice: Vec<&str> = TWICE.iter().map(|(step, _)| *step).collect();
        let engine = src.join("engine");
        let found = lifecycle_duplicates(&engine, &steps, &twice);
        assert!(
            found.is_empty(),
            "lifecycle steps defined by more than one engine module (ADR 0040: the \
             connection machine, `connection.rs` or `engine/worker.rs` defines each once): \
             {found:?}"
        );
        let all = lifecycle_duplicates(&engine, &steps, &[]);
        for step in twice {
            assert!(
                all.iter().any(|f| f.starts_with(&format!("{step}:"))),
                "`{step}` is no longer defined twice: take it out of TWICE"
            );
        }
    }

    #[test]
    fn a_planted_second_definition_of_a_step_is_rejected() {
        let dir = std::env::temp_dir().join(format!("lifecycle-{}", std::process::id()));
        let engine = dir.join("engine");
        std::fs::create_dir_all(engine.join("uring")).unwrap();
        std::fs::write(dir.join("engine.rs"), "mod epoll;\nmod uring;").unwrap();
        std::fs::write(
            engine.join("uring/conn_io.rs"),
            "impl W {\n    pub(super) fn poll_output(&mut self) {}\n    fn open_connection() {}\n}",
        )
        .unwrap();
        std::fs::write(
            engine.join("epoll.rs"),
            "// fn handle_sent() in a comment\nfn poll_output(&mut self) {}\n\
             fn open_connection() {}\nfn handle_sent() {}\n#[cfg(test)]\nfn handle_sent() {}",
        )
        .unwrap();
        std::fs::write(engine.join("stop.rs"), "fn handle_sent() {}").unwrap();
        let steps: Vec<String> = ["poll_output", "open_connection", "handle_sent"]
            .map(String::from)
            .to_vec();
        let found = lifecycle_duplicates(&engine, &steps, &["open_connection"]);
        let everything = lifecycle_duplicates(&engine, &steps, &[]);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            found,
            [
                "handle_sent: engine/epoll.rs, engine/stop.rs",
                "poll_output: engine/epoll.rs, engine/uring/conn_io.rs"
            ]
        );
        assert_eq!(everything.len(), 3, "{everything:?}");
        let machine = "impl Machine {\n    pub(crate) fn handle_served(&mut self) {}\n\
                       fn go_on() {}\n    pub(crate) fn poll_transmit() {}\n}";
        assert_eq!(machine_steps(machine), ["handle_served", "poll_transmit"]);
    }
}
