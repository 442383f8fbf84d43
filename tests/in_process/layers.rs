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

/// A source file's module path under `src/` (`global/redis/sync.rs`: `[global, redis, sync]`;
/// a `mod.rs` is its folder), and its code that ships: comments and an inline test module
/// left out. `None` for test files, fixtures and the crate roots.
fn shipped(path: &Path) -> Option<(Vec<String>, String)> {
    let rel = path.strip_prefix(SRC).ok()?.to_string_lossy().into_owned();
    let is_test = rel.ends_with("tests.rs") || rel.contains("/tests/");
    if !rel.ends_with(".rs") || is_test || rel.ends_with("fixtures.rs") {
        return None;
    }
    let mut module: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if module.last().is_some_and(|m| m == "mod") {
        module.pop();
    }
    if module == ["lib"] || module == ["main"] {
        return None;
    }
    let text = std::fs::read_to_string(path).expect("read a source file");
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    Some((module, code))
}

/// The paths `code` names from `crate::` or `super::`, each as far as its first segments
/// reach: `use super::{a::X, b}` names `[.., a, X]` and `[.., b]`. `module` is the file's own
/// path, to resolve `super::`.
fn named_paths(module: &[String], code: &str) -> Vec<Vec<String>> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let mut starts: Vec<usize> = code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
        .map(|(i, _)| i)
        .collect();
    starts.sort_unstable();
    for i in starts {
        // Only a path's first segment: not `self::super::`, `super::super::` or `a_crate::`.
        let before = if i == 0 { b' ' } else { bytes[i - 1] };
        if before.is_ascii_alphanumeric() || before == b'_' || before == b':' || before == b'$' {
            continue;
        }
        let (mut base, mut j) = if code[i..].starts_with("crate::") {
            (Vec::new(), i + 7)
        } else {
            // `super` of a file is the folder it is in.
            let mut base = module[..module.len().saturating_sub(1)].to_vec();
            let mut j = i + 7;
            while code[j..].starts_with("super::") {
                base.pop();
                j += 7;
            }
            (base, j)
        };
        // Follow plain segments, then at most one brace group.
        loop {
            let seg = ident(&code[j..]);
            if seg.is_empty() {
                break;
            }
            base.push(seg.clone());
            j += seg.len();
            if code[j..].starts_with("::") {
                j += 2;
            } else {
                break;
            }
        }
        if code[j..].starts_with('{') {
            let mut depth = 0;
            let mut start = true;
            for (k, c) in code[j..].char_indices() {
                match c {
                    '{' => {
                        depth += 1;
                        start = depth == 1;
                    }
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => start = true,
                    c if depth == 1 && start && !c.is_whitespace() => {
                        let seg = ident(&code[j + k..]);
                        if !seg.is_empty() {
                            let mut p = base.clone();
                            p.push(seg);
                            paths.push(p);
                        }
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            paths.push(base);
        }
    }
    paths
}

/// Folder under `src/` (`""` for `src/` itself) → its child modules (files and folders) →
/// the sibling modules their shipped code names.
fn sibling_imports() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    let mut stack = vec![Path::new(SRC).to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src/") {
            let path = entry.expect("an entry of src/").path();
            if path.is_dir() {
                stack.push(path);
            } else if let Some(f) = shipped(&path) {
                files.push(f);
            }
        }
    }
    let is_module = |folder: &[String], name: &str| {
        let dir = Path::new(SRC).join(folder.join("/"));
        dir.join(format!("{name}.rs")).is_file() || dir.join(name).join("mod.rs").is_file()
    };
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (module, code) in &files {
        for target in named_paths(module, code) {
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            let (Some(from), Some(to)) = (module.get(common), target.get(common)) else {
                continue; // a module naming itself, its parent or its own children
            };
            let folder = &module[..common];
            if is_module(folder, to) {
                graph
                    .entry(folder.join("/"))
                    .or_default()
                    .entry(from.clone())
                    .or_default()
                    .insert(to.clone());
            }
        }
    }
    graph
}

/// The circles of `graph`, each as the path that closes it (`a → b → a`), found once.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn walk(
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        found: &mut Vec<Vec<String>>,
    ) {
        let here = path.last().unwrap().clone();
        for next in graph.get(&here).into_iter().flatten() {
            if let Some(at) = path.iter().position(|m| m == next) {
                let mut circle = path[at..].to_vec();
                circle.push(next.clone());
                found.push(circle);
            } else if !done.contains(next) {
                path.push(next.clone());
                walk(graph, path, done, found);
                path.pop();
            }
        }
        done.insert(here);
    }
    let mut done = BTreeSet::new();
    let mut found = Vec::new();
    for start in graph.keys() {
        if !done.contains(start) {
            walk(graph, &mut vec![start.clone()], &mut done, &mut found);
        }
    }
    found
}

#[test]
fn no_two_sibling_files_of_a_folder_import_each_other() {
    let graph = sibling_imports();
    assert!(
        graph.get("rlqs").is_some_and(|g| g.len() >= 5),
        "the sibling imports of rlqs/ were not read: {graph:#?}"
    );
    let mut found = Vec::new();
    for (folder, modules) in &graph {
        for circle in circles(modules) {
            found.push(format!("src/{folder}: {}", circle.join(" → ")));
        }
    }
    assert!(
        found.is_empty(),
        "these files reach themselves through their siblings:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_circle_finder_finds_a_circle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", &["b"][..]),
        ("b", &["c"][..]),
        ("c", &["a"][..]),
        ("d", &["a"][..]),
    ]
    .into_iter()
    .map(|(m, ds)| (m.to_owned(), ds.iter().map(|d| d.to_string()).collect()))
    .collect();
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c", "a"]]);
    let named = named_paths(
        &["rlqs".into(), "share".into()],
        "use super::{replace::hold, room::Room};\nlet x = crate::core::clock::now();",
    );
    assert_eq!(
        named,
        vec![
            vec!["rlqs", "replace"],
            vec!["rlqs", "room"],
            vec!["core", "clock", "now"]
        ]
    );
}
