//! The files the docs name exist: every path in backticks in README.md, ARCHITECTURE.md and
//! docs/*.md (a codemap row that names a moved file misleads a newcomer, and nothing else
//! would notice); every module path (`core::decide`, `rls/evaluate.rs`) that README.md,
//! ARCHITECTURE.md, docs/*.md and the `//!` headers of `src/lib.rs` and each `mod.rs` name
//! resolves to a module's file; and the README stays a front page, its depth in docs/.

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

// === module paths ===

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
/// The README is a front page: depth goes to docs/ (kept a little under this so a feature
/// can add its lines).
const README_MAX_LINES: usize = 350;

/// `src`'s top-level modules: its folders, and its files but `lib.rs` and `main.rs`.
fn top_level() -> Vec<String> {
    std::fs::read_dir(SRC)
        .expect("read src/")
        .map(|e| e.expect("an entry of src/").path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            if p.is_dir() {
                Some(name)
            } else {
                let stem = name.strip_suffix(".rs")?;
                (stem != "lib" && stem != "main").then(|| stem.to_owned())
            }
        })
        .collect()
}

/// The file of the module `segments` under `dir`: `dir/a/b.rs` or `dir/a/b/mod.rs`.
fn module_file(dir: &Path, segments: &[&str]) -> Option<PathBuf> {
    let (last, parents) = segments.split_last()?;
    let mut at = dir.to_path_buf();
    for s in parents {
        at.push(s);
    }
    [at.join(format!("{last}.rs")), at.join(last).join("mod.rs")]
        .into_iter()
        .find(|f| f.is_file())
}

/// Whether the module file `file` declares or re-exports the item `name` (a function such as
/// `global::spawn`, named by its module's path).
fn declares(file: &Path, name: &str) -> bool {
    let text = std::fs::read_to_string(file).expect("read a module file");
    let is_name = |rest: &str| {
        rest.strip_prefix(name)
            .is_some_and(|r| !r.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
    };
    let declared = ["fn ", "mod ", "macro_rules! "].iter().any(|k| {
        text.match_indices(k)
            .any(|(i, _)| is_name(&text[i + k.len()..]))
    });
    // A re-export may span lines: `pub use report::{` on one, `check,` on the next.
    let exported = text.match_indices("pub use ").any(|(i, _)| {
        let statement = text[i..].split(';').next().unwrap_or("");
        statement
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == name)
    });
    declared || exported
}

/// Checks a `::` path against the modules under `src/` (or, in a `mod.rs` header, under its
/// own folder `base` when it starts with a child module). `None`: not a path into this crate
/// (`std::time`, `RuleSet::find`, `lib::run`). The segments up to the first type name are
/// modules, but the last, which may be an item its parent module declares.
fn module_path(path: &str, base: &Path, tops: &[String]) -> Option<Result<(), String>> {
    let path = path.strip_prefix("crate::").unwrap_or(path);
    let segments: Vec<&str> = path.split("::").collect();
    let modules: Vec<&str> = segments
        .iter()
        .take_while(|s| s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_'))
        .copied()
        .collect();
    let root = if modules.is_empty() {
        return None;
    } else if tops.iter().any(|t| t == modules[0]) {
        Path::new(SRC)
    } else if base != Path::new(SRC) && module_file(base, &modules[..1]).is_some() {
        base
    } else {
        return None;
    };
    for k in 1..=modules.len() {
        if module_file(root, &modules[..k]).is_some() {
            continue;
        }
        let item = k == modules.len()
            && k > 1
            && module_file(root, &modules[..k - 1]).is_some_and(|f| declares(&f, modules[k - 1]));
        return Some(if item {
            Ok(())
        } else {
            Err(format!("no module `{}`", modules[..k].join("::")))
        });
    }
    Some(Ok(()))
}

/// Checks a file or folder path (`rls/evaluate.rs`, `src/rlqs/young.rs`, `core/table/`).
/// In README.md and ARCHITECTURE.md (`header: false`) only paths from `src/` or starting with
/// a top-level module are module paths; in a `//!` header every `.rs` or folder name is,
/// looked up from the header's own folder `base` (and below it), then from each folder above
/// it up to `src/` (a sibling module's `window/share.rs`), then from the root.
fn file_path(path: &str, base: &Path, header: bool, tops: &[String]) -> Option<Result<(), String>> {
    if !(path.ends_with(".rs") || path.ends_with('/')) {
        return None;
    }
    let exists = |dir: &Path| {
        let p = dir.join(path);
        if path.ends_with('/') {
            p.is_dir()
        } else {
            p.is_file()
        }
    };
    let found = if let Some(rest) = path.strip_prefix("src/") {
        exists(Path::new(SRC)) || Path::new(SRC).join(rest).exists()
    } else if !header {
        let first = path.split('/').next().unwrap_or("");
        if !path.contains('/') || !tops.iter().any(|t| t == first) {
            return None;
        }
        exists(Path::new(SRC))
    } else {
        let mut below = Vec::new();
        files(base, &mut below);
        let mut above = base.ancestors().take_while(|d| d.starts_with(SRC));
        below.iter().any(|f| f.ends_with(&format!("/{path}")))
            || above.any(exists)
            || exists(Path::new(ROOT))
    };
    Some(if found {
        Ok(())
    } else {
        Err(format!("no file `{path}`"))
    })
}

/// The backticked spans of `text`, each with the line it starts on; fenced code blocks are
/// left out (their backticks are not markdown's).
fn spans(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let prose: Vec<&str> = text
        .lines()
        .map(|l| {
            let fence = l.trim_start().starts_with("```");
            fenced ^= fence;
            if fence || fenced {
                ""
            } else {
                l
            }
        })
        .collect();
    let prose = prose.join("\n");
    let mut out = Vec::new();
    let mut offset = 0;
    for (i, part) in prose.split('`').enumerate() {
        if i % 2 == 1 && !part.contains([' ', '\n']) {
            let line = prose[..offset].matches('\n').count() + 1;
            out.push((line, part.to_owned()));
        }
        offset += part.len() + 1;
    }
    out
}

/// The module paths a doc names that do not exist, as `doc:line: why`. `base` is the folder
/// relative names start from; `header` says the text is a `//!` header.
fn broken_paths(
    doc: &str,
    text: &str,
    base: &Path,
    header: bool,
    tops: &[String],
) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut broken = Vec::new();
    for (line, span) in spans(text) {
        let lead: String = span
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let result = if lead.contains("::") && !lead.ends_with(':') {
            module_path(&lead, base, tops)
        } else if !span.contains(['*', '<', '{', '$', '=', '(']) && !span.contains("://") {
            file_path(span.trim_start_matches("./"), base, header, tops)
        } else {
            None
        };
        match result {
            Some(Ok(())) => checked += 1,
            Some(Err(why)) => broken.push(format!("{doc}:{line}: `{span}`: {why}")),
            None => {}
        }
    }
    (checked, broken)
}

/// The `//!` header of a source file: its opening lines, the prefix stripped (line numbers
/// stay the file's).
fn header(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read a source file");
    text.lines()
        .map_while(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_module_path_the_docs_name_exists() {
    let tops = top_level();
    let src = Path::new(SRC);
    let mut sources: Vec<(String, String, PathBuf, bool)> = Vec::new();
    let mut docs = vec!["README.md".to_owned(), "ARCHITECTURE.md".to_owned()];
    for entry in std::fs::read_dir(Path::new(ROOT).join("docs")).expect("docs/") {
        let name = entry.expect("a docs entry").file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".md") {
            docs.push(format!("docs/{name}"));
        }
    }
    for doc in docs {
        let text = std::fs::read_to_string(Path::new(ROOT).join(&doc)).expect("read a doc");
        sources.push((doc, text, src.to_path_buf(), false));
    }
    let mut all = Vec::new();
    files(src, &mut all);
    for rel in all
        .iter()
        .filter(|f| f.as_str() == "src/lib.rs" || f.ends_with("/mod.rs"))
    {
        let path = Path::new(ROOT).join(rel);
        let base = path.parent().expect("a folder").to_path_buf();
        sources.push((rel.clone(), header(&path), base, true));
    }
    let mut checked = 0;
    let mut broken = Vec::new();
    for (doc, text, base, is_header) in &sources {
        let (n, b) = broken_paths(doc, text, base, *is_header, &tops);
        checked += n;
        broken.extend(b);
    }
    assert!(
        checked > 100,
        "only {checked} module paths found in the docs"
    );
    assert!(
        broken.is_empty(),
        "the docs name modules that do not exist:\n{}",
        broken.join("\n")
    );
}

#[test]
fn a_path_to_a_missing_module_is_caught() {
    let tops = top_level();
    let src = Path::new(SRC);
    let text = "`core::decide`, `global::sync::plan`, `global::spawn`, `rls/evaluate.rs`,\n\
                `src/rlqs/young.rs`, `rlqs::check`, `std::time`\n\
                `core::fleet`, `global::sync::nope`, `rls/nope.rs`, `src/core/gone/`\n";
    let (checked, broken) = broken_paths("x.md", text, src, false, &tops);
    assert_eq!(checked, 6, "{broken:?}");
    assert_eq!(
        broken,
        [
            "x.md:3: `core::fleet`: no module `core::fleet`",
            "x.md:3: `global::sync::nope`: no module `global::sync::nope`",
            "x.md:3: `rls/nope.rs`: no file `rls/nope.rs`",
            "x.md:3: `src/core/gone/`: no file `src/core/gone/`",
        ]
    );
}

#[test]
fn the_readme_stays_a_front_page() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README.md");
    let lines = text.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, over {README_MAX_LINES}: move the depth to docs/ and link it"
    );
}
