//! The files the docs name exist: every path in backticks in README.md, ARCHITECTURE.md and
//! docs/*.md (a codemap row that names a moved file misleads a newcomer, and nothing else
//! would notice).

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const EXTENSIONS: [&str; 8] = [
    ".rs", ".lua", ".py", ".sh", ".yaml", ".json", ".md", ".toml",
];

/// Every file of the repository that a doc may name, relative to the root.
fn files(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("read a directory of the repository") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        // Build output and Git's own files are named, not listed.
        if path.is_dir() && name != ".git" && name != "target" {
            files(&path, out);
        }
        let rel = path.strip_prefix(ROOT).expect("under the root");
        let mut rel = rel.to_string_lossy().into_owned();
        if path.is_dir() {
            rel.push('/');
        }
        out.push(rel);
    }
}

/// The paths a doc names: backticked tokens that end in a known extension or in `/`, with no
/// spaces, globs or placeholders.
fn named(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|t| t.split("::").next().unwrap_or(t))
        .filter(|t| !t.contains([' ', '*', '<', '{', '$', '=', '(']) && !t.starts_with('-'))
        .filter(|t| t.contains('/') || EXTENSIONS.iter().any(|e| t.ends_with(e)))
        .filter(|t| EXTENSIONS.iter().any(|e| t.ends_with(e)) || t.ends_with('/'))
        .filter(|t| !t.contains("://") && !t.starts_with('/'))
        .map(str::to_owned)
        .collect()
}

/// A name is found when it is a path from the root or from `src/`, or the end of one (docs
/// may name `core/table.rs` or `sync.lua` where the context says which folder).
fn found(name: &str, all: &[String]) -> bool {
    let name = name.trim_start_matches("./");
    all.iter().any(|f| {
        f == name || f.strip_prefix("src/") == Some(name) || f.ends_with(&format!("/{name}"))
    })
}

#[test]
fn every_file_the_docs_name_exists() {
    let mut all = Vec::new();
    files(Path::new(ROOT), &mut all);
    // Not CHANGELOG.md: the paths it names may be history.
    let mut docs: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md"]
        .iter()
        .map(|d| Path::new(ROOT).join(d))
        .collect();
    for entry in std::fs::read_dir(Path::new(ROOT).join("docs")).expect("docs/") {
        docs.push(entry.expect("a docs entry").path());
    }
    let mut checked = 0;
    let mut missing = Vec::new();
    for doc in docs
        .iter()
        .filter(|d| d.extension().is_some_and(|e| e == "md"))
    {
        let text = std::fs::read_to_string(doc).expect("read a doc");
        let doc_name = doc.file_name().unwrap().to_string_lossy().into_owned();
        for name in named(&text) {
            checked += 1;
            if !found(&name, &all) {
                missing.push(format!("{doc_name}: `{name}`"));
            }
        }
    }
    assert!(checked > 100, "only {checked} paths found in the docs");
    assert!(
        missing.is_empty(),
        "the docs name files that do not exist:\n{}",
        missing.join("\n")
    );
}
