//! One error in a rules file, as users read it (`"<file>: <message> (line L, column C; domain
//! 'd', descriptor path 'k' > 'k2_v')"`), and the pass that gives errors their line and
//! column from the text (with `locate.rs`), within a budget.

use super::locate::{locate, Step};

/// One error in one rules file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}{}", self.whereabouts())]
pub struct ConfigError {
    /// The file the error is in, as it was named to the loader.
    pub file: String,
    /// What is wrong, in envoyproxy/ratelimit's wording where it has one.
    pub message: String,
    /// The 1-based line of the error's subject in the file, when known (u32: a rules file
    /// is at most 4 MiB, and the error stays small).
    pub line: Option<u32>,
    /// The 1-based column of the error's subject, with `line`.
    pub column: Option<u32>,
    /// The domain and descriptor path the error is in (`domain 'edge', descriptor path
    /// 'remote_address' > 'path_/api'`), when it is in one.
    pub place: Option<String>,
    /// The node the error is about, still to be given a line (see `locate.rs`).
    pub(crate) node: Option<Vec<Step>>,
}

impl ConfigError {
    /// An error in `file`.
    pub fn new(file: &str, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_string(),
            message: message.into(),
            line: None,
            column: None,
            place: None,
            node: None,
        }
    }

    /// The error, about the node at `node` (located later, from the text) in `place`.
    pub(crate) fn at(mut self, node: Vec<Step>, place: Option<String>) -> Self {
        self.node = Some(node);
        self.place = place;
        self
    }

    /// ` (line 5, column 7; domain 'edge', descriptor path 'a' > 'b')`, or what of it is known.
    fn whereabouts(&self) -> String {
        let line = match (self.line, self.column) {
            (Some(l), Some(c)) => Some(format!("line {l}, column {c}")),
            (Some(l), None) => Some(format!("line {l}")),
            _ => None,
        };
        match (line, &self.place) {
            (Some(l), Some(p)) => format!(" ({l}; {p})"),
            (Some(l), None) => format!(" ({l})"),
            (None, Some(p)) => format!(" ({p})"),
            (None, None) => String::new(),
        }
    }
}

/// The words that place an error in a domain's tree: `domain 'edge', descriptor path
/// 'remote_address' > 'path_/api'`, each step a descriptor's `key` or `key_value`.
pub(crate) fn place(domain: &str, path: &[String]) -> Option<String> {
    let steps = path
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(" > ");
    match (domain.is_empty(), path.is_empty()) {
        (true, true) => None,
        (false, true) => Some(format!("domain '{domain}'")),
        (true, false) => Some(format!("descriptor path {steps}")),
        (false, false) => Some(format!("domain '{domain}', descriptor path {steps}")),
    }
}

/// Text re-read to locate one file's errors in one load, at most: 4 lookups in a file at the
/// 4 MiB bound (each costs about one parse of the file), hundreds in a file of ordinary size
/// (tens of KB). The first error is always located.
pub const LOCATE_BUDGET_BYTES: usize = 16 << 20;

/// Gives a line and column to every error of `file` that names a node and has none yet,
/// within [`LOCATE_BUDGET_BYTES`] of re-read text.
pub fn resolve(errors: &mut [ConfigError], file: &str, content: &str) {
    resolve_within(errors, file, content, LOCATE_BUDGET_BYTES);
}

/// [`resolve`] with a budget of `budget` bytes re-read; errors past it keep their place
/// (domain and descriptor path) without a line.
fn resolve_within(errors: &mut [ConfigError], file: &str, content: &str, budget: usize) {
    let mut spent = 0usize;
    for e in errors.iter_mut().filter(|e| e.file == file) {
        let Some(path) = e.node.take() else { continue };
        if e.line.is_some() {
            continue;
        }
        if spent > 0 && spent.saturating_add(content.len()) > budget {
            break;
        }
        spent = spent.saturating_add(content.len().max(1));
        if let Some((line, column)) = locate(content, &path) {
            e.line = Some(line);
            e.column = Some(column);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locating_stops_at_the_budget_and_later_errors_keep_their_place() {
        let text = "domain: d\ndescriptors:\n  - key: a\n  - key: b\n  - key: c\n";
        let mut errors: Vec<ConfigError> = (0..3)
            .map(|i| {
                ConfigError::new("f.yaml", "m").at(
                    vec![Step::Key("descriptors"), Step::Index(i)],
                    Some("p".into()),
                )
            })
            .collect();
        errors.push(ConfigError::new("other.yaml", "m").at(vec![], None));
        // Room for two reads of the text: the first two errors get lines, the third not.
        resolve_within(&mut errors, "f.yaml", text, 2 * text.len());
        let lines: Vec<_> = errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, [Some(3), Some(4), None, None]);
        assert_eq!(errors[2].to_string(), "f.yaml: m (p)");
        assert_eq!(errors[1].to_string(), "f.yaml: m (line 4, column 5; p)");
        // Another file's error is left for its own text.
        assert!(errors[3].node.is_some());
        // The first error is located whatever the budget.
        let mut one = vec![ConfigError::new("f.yaml", "m").at(vec![], None)];
        resolve_within(&mut one, "f.yaml", text, 0);
        assert_eq!(one[0].line, Some(1));
    }
}
