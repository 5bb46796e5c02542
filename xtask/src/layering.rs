//! A test of the tree's shape: inside each product crate, no two top-level modules import
//! each other (directly or around a longer circle), except the circles listed in
//! [`ALLOWED`], each of which has a comment at its import saying why (issue 21).

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    /// (crate, circle as its modules in order): circles kept on purpose.
    const ALLOWED: &[(&str, &[&str])] = &[
        // conn.rs holds the worker's vectored-send state (see the comment on `vec_send`).
        ("runtime", &["conn", "worker"]),
    ];

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

    /// The top-level module a file belongs to (`None` for the crate root and test files).
    fn top_module(src: &Path, file: &Path) -> Option<String> {
        let rel = file.strip_prefix(src).ok()?;
        let first = rel.components().next()?.as_os_str().to_str()?;
        let name = first.trim_end_matches(".rs");
        let skip = ["lib", "main"].contains(&name) || name.contains("test");
        (!skip).then(|| name.to_string())
    }

    /// `crate::NAME` paths in a file's code: comments and `#[cfg(test)]` parts left out.
    fn imports(text: &str) -> BTreeSet<String> {
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let mut out = BTreeSet::new();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (at, _) in line.match_indices("crate::") {
                let name: String = line[at + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
        out
    }

    fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in files {
            let Some(from) = top_module(src, &file) else {
                continue;
            };
            let text = std::fs::read_to_string(&file).unwrap();
            let to: Vec<String> = imports(&text).into_iter().filter(|t| *t != from).collect();
            graph.entry(from).or_default().extend(to);
        }
        graph
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

    #[test]
    fn no_module_imports_its_importer_inside_a_crate() {
        let appliance = Path::new(env!("CARGO_MANIFEST_DIR")).join("../appliance");
        let mut unexplained = Vec::new();
        for entry in std::fs::read_dir(&appliance).unwrap().flatten() {
            let src = entry.path().join("src");
            let krate = entry.file_name().to_string_lossy().into_owned();
            if !src.is_dir() {
                continue;
            }
            for circle in circles(&graph(&src)) {
                let allowed = ALLOWED.iter().any(|(c, members)| {
                    let mut m: Vec<String> = members.iter().map(|s| s.to_string()).collect();
                    m.sort();
                    *c == krate && m == circle
                });
                if !allowed {
                    unexplained.push(format!("{krate}: {}", circle.join(" <-> ")));
                }
            }
        }
        assert!(
            unexplained.is_empty(),
            "import circles inside a crate: {unexplained:?}"
        );
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
        let text = "use crate::state::State;\n// crate::tuning\nfn f() { crate::plane::go() }";
        let names: Vec<String> = imports(text).into_iter().collect();
        assert_eq!(names, ["plane", "state"]);
    }
}
