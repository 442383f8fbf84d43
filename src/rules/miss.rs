//! Why a descriptor matched no rule (`POST /explain`): the first entry where the walk of
//! [`RuleSet::find`] stopped, and why. Walks as `find` does, step for step, so that the
//! reason given is the one that applied.

use super::{EntryRef, RuleSet};

/// Why [`RuleSet::find`] found no rule for a descriptor. Levels are the descriptor's entries,
/// counted from 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// The descriptor has no entries.
    NoEntries,
    /// No rules file names the domain.
    UnknownDomain,
    /// The level has no node for the entry's key (the tree ended above it, or names other
    /// keys there).
    NoKey {
        /// The entry's position, from 1.
        level: usize,
        /// The entry's key.
        key: String,
    },
    /// The level names the key, but neither an exact value, a wildcard nor a key-only node
    /// takes the entry's value.
    NoValue {
        /// The entry's position, from 1.
        level: usize,
        /// The entry's key.
        key: String,
        /// The entry's value.
        value: String,
    },
    /// The node the last entry selected has no `rate_limit` (a limit applies only at the
    /// descriptor's last entry: the descriptor is shorter than the rule's path).
    NoLimit {
        /// The last entry's position, from 1.
        level: usize,
        /// The last entry's key.
        key: String,
        /// The last entry's value.
        value: String,
    },
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Miss::NoEntries => write!(f, "the descriptor has no entries"),
            Miss::UnknownDomain => write!(f, "no rules for this domain"),
            Miss::NoKey { level, key } => write!(f, "no node for key '{key}' at level {level}"),
            Miss::NoValue { level, key, value } => write!(
                f,
                "key '{key}' at level {level}: no value, wildcard or key-only node takes '{value}'"
            ),
            Miss::NoLimit { level, key, value } => write!(
                f,
                "the node '{key}' = '{value}' at level {level} (the last entry) has no rate_limit"
            ),
        }
    }
}

// === impl RuleSet ===

impl RuleSet {
    /// Why `entries` match no rule of `domain`; `None` when [`RuleSet::find`] finds one.
    pub fn miss<E: EntryRef>(&self, domain: &str, entries: &[E]) -> Option<Miss> {
        let Some((last, path)) = entries.split_last() else {
            return Some(Miss::NoEntries);
        };
        let Some(mut walk) = self.walk(domain) else {
            return Some(Miss::UnknownDomain);
        };
        let no_node = |level: usize, e: &E, has_key: bool| {
            if has_key {
                Miss::NoValue {
                    level,
                    key: e.key().to_string(),
                    value: e.value().to_string(),
                }
            } else {
                Miss::NoKey {
                    level,
                    key: e.key().to_string(),
                }
            }
        };
        for (i, entry) in path.iter().enumerate() {
            let Some(node) = walk.select(entry.key(), entry.value()) else {
                return Some(no_node(i + 1, entry, walk.level.contains_key(entry.key())));
            };
            walk.enter(node, entry.value());
        }
        let level = entries.len();
        let Some(key_level) = walk.level.get(last.key()) else {
            return Some(no_node(level, last, false));
        };
        if key_level.overrides.contains_key(last.value()) {
            return None;
        }
        match key_level.lookup(last.value()) {
            None => Some(no_node(level, last, true)),
            Some(node) if node.rule.is_none() => Some(Miss::NoLimit {
                level,
                key: last.key().to_string(),
                value: last.value().to_string(),
            }),
            Some(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "domain: d\ndescriptors:\n  - key: a\n    value: x\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 1}\n";

    #[test]
    fn a_miss_names_the_entry_where_the_walk_stopped() {
        let set = crate::rules::compile_sources(&[("r.yaml".into(), RULES.into())], false).unwrap();
        let miss = |domain: &str, entries: &[(&str, &str)]| set.miss(domain, entries);
        assert_eq!(miss("d", &[("c", "1")]), None);
        assert_eq!(miss("d", &[("a", "x"), ("b", "2")]), None);
        assert!(set.find("d", &[("a", "x"), ("b", "2")]).is_some());
        assert_eq!(miss("other", &[("c", "1")]), Some(Miss::UnknownDomain));
        assert_eq!(
            miss("d", &[("z", "1")]),
            Some(Miss::NoKey {
                level: 1,
                key: "z".into()
            })
        );
        assert_eq!(
            miss("d", &[("a", "y"), ("b", "2")]),
            Some(Miss::NoValue {
                level: 1,
                key: "a".into(),
                value: "y".into()
            })
        );
        assert_eq!(
            miss("d", &[("a", "x"), ("q", "2")]),
            Some(Miss::NoKey {
                level: 2,
                key: "q".into()
            })
        );
        let short = miss("d", &[("a", "x")]).unwrap();
        assert_eq!(
            short.to_string(),
            "the node 'a' = 'x' at level 1 (the last entry) has no rate_limit"
        );
        assert_eq!(
            miss("d", &[("c", "1"), ("b", "2")]),
            Some(Miss::NoKey {
                level: 2,
                key: "b".into()
            })
        );
    }
}
