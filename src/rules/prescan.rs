//! Bounds checked on a rules file's text before the YAML parser sees it: its size and how
//! deeply it nests. libyaml's scanner does work proportional to the open nesting for every
//! token, so ~200 KB of `[[[[…` takes tens of seconds to reject; a file past these bounds is
//! refused at once, by a single linear pass, whether it comes from `sluice check`, startup or
//! a hot reload.
//!
//! The scan is deliberately approximate and errs towards counting more: it tracks quoted
//! scalars, comments and block scalars (`|`, `>`) only so that brackets inside them are not
//! counted. Flow brackets (`[`, `{`) count one level each, and so does each block
//! indentation level and each `- ` on a line. Valid rules nest far less than the bound:
//! ten descriptor levels come to about 25.

/// Largest rules file accepted, in bytes (4 MiB): hundreds of times any real rules file.
pub const MAX_FILE_BYTES: usize = 4 << 20;

/// Deepest nesting accepted, counting flow brackets, indentation levels and `- ` entries.
/// serde_yaml gives up at 128 anyway; 64 leaves valid files (about 2 per descriptor level)
/// ample room.
pub const MAX_DEPTH: usize = 64;

/// Why a file was refused before parsing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrescanError {
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("the file is {0} bytes, more than the {MAX_FILE_BYTES} allowed")]
    TooLarge(usize),
    /// The file nests deeper than [`MAX_DEPTH`].
    #[error("nesting deeper than {MAX_DEPTH} levels at line {0}")]
    TooDeep(usize),
}

/// Checks `text` against [`MAX_FILE_BYTES`] and [`MAX_DEPTH`] in one linear pass.
///
/// # Errors
/// The first bound exceeded, with the line where the nesting went too deep.
pub fn check(text: &str) -> Result<(), PrescanError> {
    if text.len() > MAX_FILE_BYTES {
        return Err(PrescanError::TooLarge(text.len()));
    }
    let mut scan = Scan::default();
    for (i, line) in text.lines().enumerate() {
        if scan.line(line) > MAX_DEPTH {
            return Err(PrescanError::TooDeep(i + 1));
        }
    }
    Ok(())
}

/// What continues from one line to the next.
#[derive(Debug, Default)]
struct Scan {
    /// Open `[` and `{`.
    flow: usize,
    /// Indentations of the open block levels, innermost last.
    indents: Vec<usize>,
    /// Inside a quoted scalar opened by this quote character.
    quote: Option<u8>,
    /// Inside a block scalar whose header line had this indentation.
    block_scalar: Option<usize>,
}

impl Scan {
    /// Scans one line; returns the deepest nesting reached on it.
    fn line(&mut self, line: &str) -> usize {
        let bytes = line.as_bytes();
        let indent = bytes.iter().take_while(|b| **b == b' ').count();
        let blank = indent == bytes.len() || bytes[indent] == b'#';
        if let Some(header) = self.block_scalar {
            if blank || indent > header {
                return 0; // the block scalar's text: nothing in it nests
            }
            self.block_scalar = None;
        }
        if blank && self.quote.is_none() {
            return 0;
        }
        if self.flow == 0 && self.quote.is_none() {
            while self.indents.last().is_some_and(|top| *top > indent) {
                self.indents.pop();
            }
            if self.indents.last().is_none_or(|top| *top < indent) {
                self.indents.push(indent);
            }
        }
        let mut deepest = 0;
        let mut dashes = 0;
        let mut at_value = true; // where a quote, bracket or block scalar header may start
        let mut i = if self.quote.is_some() { 0 } else { indent };
        while i < bytes.len() {
            let b = bytes[i];
            if let Some(q) = self.quote {
                i += match (b, q) {
                    (b'\\', b'"') => 2,
                    (b'\'', b'\'') if bytes.get(i + 1) == Some(&b'\'') => 2,
                    _ if b == q => {
                        self.quote = None;
                        at_value = false;
                        1
                    }
                    _ => 1,
                };
                continue;
            }
            let next_is_space = bytes.get(i + 1).is_none_or(|n| *n == b' ' || *n == b'\t');
            let prev_is_space = i == 0 || bytes[i - 1] == b' ' || bytes[i - 1] == b'\t';
            match b {
                b'#' if prev_is_space => break,
                b'[' | b'{' if at_value || self.flow > 0 => {
                    self.flow += 1;
                    at_value = true;
                }
                b']' | b'}' if self.flow > 0 => self.flow -= 1,
                b',' if self.flow > 0 => at_value = true,
                b'"' | b'\'' if at_value => self.quote = Some(b),
                b'|' | b'>' if at_value && self.flow == 0 => {
                    self.block_scalar = Some(indent);
                    break;
                }
                b'-' | b'?' if at_value && next_is_space && self.flow == 0 => dashes += 1,
                b':' if next_is_space => at_value = true,
                b' ' | b'\t' => {}
                _ => at_value = false,
            }
            deepest = deepest.max(self.indents.len() + dashes + self.flow);
            i += 1;
        }
        deepest.max(self.indents.len() + dashes + self.flow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(text: &str) -> usize {
        let mut scan = Scan::default();
        text.lines().map(|l| scan.line(l)).max().unwrap_or(0)
    }

    #[test]
    fn counts_brackets_indentation_and_dashes() {
        assert_eq!(depth("a: [[1], {b: [2]}]\n"), 4);
        assert_eq!(depth("a:\n  b:\n    c: 1\n"), 3);
        assert_eq!(depth("- - - x\n"), 4);
        assert_eq!(
            depth("a: [\n  [\n    1],\n  2]\nb: 1\n"),
            3,
            "flow spans lines"
        );
    }

    #[test]
    fn brackets_in_scalars_and_comments_do_not_count() {
        let text = "a: '[[[[it''s ['\nb: \"{{{\\\"{{\"\nc: /api/[id]/{x}\nd: x # [[[[\ne: |\n  [[[[[[\n  {{{{{{\nf: 1\n";
        assert_eq!(depth(text), 1);
        assert_eq!(depth("a: \"[[\n[[[\"\nb: 1\n"), 1, "quotes span lines");
    }

    #[test]
    fn bounds_name_the_line() {
        let deep = format!("domain: d\ndescriptors: {}\n", "[".repeat(100_000));
        assert_eq!(check(&deep), Err(PrescanError::TooDeep(2)));
        let big = "#".repeat(MAX_FILE_BYTES + 1);
        assert_eq!(check(&big), Err(PrescanError::TooLarge(MAX_FILE_BYTES + 1)));
    }

    #[test]
    fn the_repositorys_rules_files_pass() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut seen = 0;
        for dir in [
            "config/rules",
            "config/envoy",
            "tests/data",
            "helm/sluice",
            "helm/sluice/ci",
        ] {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    assert_eq!(check(&text), Ok(()), "{}", path.display());
                    assert!(depth(&text) <= 32, "{}: {}", path.display(), depth(&text));
                    seen += 1;
                }
            }
        }
        assert!(seen >= 7, "found the files: {seen}");
    }
}
