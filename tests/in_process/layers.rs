//! The layers point one way (ARCHITECTURE.md, "Layers"): no two of `src/`'s top-level modules
//! import each other, even through others, and the pure core (`core`, `rules`) imports
//! nothing from the rest. Read from the source text, tests left out (they may reach anywhere).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Top-level module → the top-level modules its non-test code names as `crate::<module>`.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![Path::new(SRC).to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src/") {
            let path = entry.expect("an entry of src/").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(SRC)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let is_test = rel.ends_with("tests.rs") || rel.contains("/tests/");
            if !rel.ends_with(".rs") || is_test || rel.ends_with("fixtures.rs") {
                continue;
            }
            let module = rel
                .split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_owned();
            if module == "lib" || module == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            // An inline test module ends the code that ships.
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            let deps = graph.entry(module.clone()).or_default();
            for (i, _) in code.match_indices("crate::") {
                let name: String = code[i + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    deps.insert(name);
                }
            }
        }
    }
    graph
}

/// Every module `from` reaches through imports.
fn reach(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_owned()];
    while let Some(m) = todo.pop() {
        for d in graph.get(&m).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn no_two_top_level_modules_import_each_other() {
    let graph = imports();
    assert!(graph.len() >= 10, "found only {:?}", graph.keys());
    let circles: Vec<String> = graph
        .keys()
        .filter(|m| reach(&graph, m).contains(*m))
        .cloned()
        .collect();
    assert!(
        circles.is_empty(),
        "these modules reach themselves through imports: {circles:?}\n{graph:#?}"
    );
}

#[test]
fn the_pure_core_imports_nothing_from_the_rest() {
    let graph = imports();
    for (module, allowed) in [("core", &[][..]), ("rules", &["core"][..])] {
        let reached = reach(&graph, module);
        let outside: Vec<_> = reached
            .iter()
            .filter(|m| !allowed.contains(&m.as_str()))
            .collect();
        assert!(outside.is_empty(), "{module} imports {outside:?}");
    }
}
