//! The descriptor tree of a compiled domain: per level, exact values, wildcard patterns in file
//! order and the key-only node, and the lookup that picks one of them for a request value.

use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Exact,
    Wildcard,
    AnyValue,
}

#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) kind: Kind,
    /// `key` or `key_value`, the reference's composite key part.
    pub(crate) final_key: String,
    pub(crate) rule: Option<usize>,
    pub(crate) share_threshold: bool,
    pub(crate) value_to_metric: bool,
    pub(crate) children: HashMap<String, KeyLevel>,
}

#[derive(Debug, Default)]
pub(crate) struct KeyLevel {
    pub(crate) exact: HashMap<String, Node>,
    pub(crate) wildcards: Vec<(String, Node)>,
    pub(crate) any_value: Option<Box<Node>>,
}

impl KeyLevel {
    pub(crate) fn lookup(&self, value: &str) -> Option<&Node> {
        self.exact
            .get(value)
            .or_else(|| {
                self.wildcards
                    .iter()
                    .find(|(p, _)| wildcard_match(p.as_bytes(), value.as_bytes()))
                    .map(|(_, n)| n)
            })
            .or(self.any_value.as_deref())
    }
}

/// Whether `value` matches `pattern`, where `*` matches zero or more bytes. Linear in practice:
/// on a mismatch it retries only from the last `*`.
pub(crate) fn wildcard_match(pattern: &[u8], value: &[u8]) -> bool {
    let (mut p, mut v) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while v < value.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, v));
            p += 1;
        } else if p < pattern.len() && pattern[p] == value[v] {
            p += 1;
            v += 1;
        } else if let Some((sp, sv)) = star {
            p = sp + 1;
            v = sv + 1;
            star = Some((sp, sv + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_anywhere() {
        for (p, v, m) in [
            ("foo*", "foo", true),
            ("foo*", "foobar", true),
            ("*bar", "foobar", true),
            ("f*b*r", "foobar", true),
            ("f*b*r", "foobaz", false),
            ("*", "", true),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("*ab", "aab", true),
        ] {
            assert_eq!(wildcard_match(p.as_bytes(), v.as_bytes()), m, "{p} ~ {v}");
        }
    }
}
