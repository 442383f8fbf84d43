//! Where each rule was written: its rules file (or xDS resource) and, found on demand, the
//! line of its descriptor (`POST /explain`).
//!
//! Lines are not found when the rules load: serde_yaml keeps no positions, and finding one
//! (`locate.rs`) re-reads the whole file, so locating every rule would cost a load one parse
//! per rule. Instead the set keeps each file's text and each rule's [`Step`] path, and
//! [`RuleSet::source`] finds the line of the few rules an explanation names, within a budget
//! of re-read bytes the caller holds.

use std::sync::Arc;

use super::locate::{locate, Step};
use super::RuleSet;

/// The prefix of the name a rule set built from xDS gives each `RateLimitConfig` resource
/// (`sources/xds/convert.rs`): such a rule has no file and no line.
pub const XDS_PREFIX: &str = "xds:";

/// Where one compiled rule came from: the name of its source and the path to its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    /// The rules file's name as loaded (shared by the file's rules).
    pub(crate) file: Arc<str>,
    /// From the top of the file to the rule's descriptor (an override: its entry).
    pub(crate) node: Vec<Step>,
}

/// A rule's source as an explanation reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A rules file, and the 1-based line of the rule's descriptor when it was found.
    File {
        /// The file's name as loaded.
        file: String,
        /// The descriptor's line; `None` past the caller's budget.
        line: Option<u32>,
    },
    /// An xDS `RateLimitConfig` resource, by name.
    Xds {
        /// The resource's name (`resources[i]` when it has none).
        resource: String,
    },
}

// === impl RuleSet ===

impl RuleSet {
    /// Where the rule at `index` (in [`RuleSet::rules`]) came from. Finding its line re-reads
    /// its file: done only while `budget` (bytes) holds the file's length, which is then
    /// taken from it; past it the line is `None`.
    pub fn source(&self, index: usize, budget: &mut usize) -> Option<Source> {
        let origin = self.origins.get(index)?;
        if let Some(resource) = origin.file.strip_prefix(XDS_PREFIX) {
            return Some(Source::Xds {
                resource: resource.to_string(),
            });
        }
        let text = self
            .texts
            .iter()
            .find(|(name, _)| **name == *origin.file)
            .map(|(_, text)| text);
        let line = text.and_then(|text| {
            let cost = text.len().max(1);
            if cost > *budget {
                return None;
            }
            *budget -= cost;
            locate(text, &origin.node).map(|(line, _)| line)
        });
        Some(Source::File {
            file: origin.file.to_string(),
            line,
        })
    }

    /// Keeps the texts the set was compiled from, for [`RuleSet::source`]'s lines.
    pub(crate) fn keep_texts(&mut self, sources: &[(String, String)]) {
        self.texts = sources
            .iter()
            .map(|(name, text)| (Arc::from(name.as_str()), Arc::from(text.as_str())))
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    overrides:\n      big: 50\n";

    #[test]
    fn a_rule_names_its_file_and_the_line_of_its_descriptor_or_override() {
        let set = crate::rules::compile_sources(&[("r.yaml".into(), RULES.into())], false).unwrap();
        let index = |key: &str| set.rules().iter().position(|r| r.full_key == key).unwrap();
        let mut budget = usize::MAX;
        let at = |i, budget: &mut usize| match set.source(i, budget) {
            Some(Source::File { file, line }) => (file, line),
            other => panic!("{other:?}"),
        };
        assert_eq!(at(index("d.a"), &mut budget), ("r.yaml".into(), Some(3)));
        assert_eq!(
            at(index("d.tenant"), &mut budget),
            ("r.yaml".into(), Some(5))
        );
        assert_eq!(
            at(index("d.tenant_big"), &mut budget),
            ("r.yaml".into(), Some(8))
        );
        // Past the budget the file is still named, without a line.
        let mut small = RULES.len() - 1;
        assert_eq!(at(index("d.a"), &mut small), ("r.yaml".into(), None));
        assert_eq!(small, RULES.len() - 1, "nothing spent");
    }

    #[test]
    fn a_rule_from_xds_names_its_resource() {
        let file = crate::rules::model::parse_lenient("xds:limits", RULES)
            .file
            .unwrap();
        let set = RuleSet::compile(&[("xds:limits".into(), file)], false).unwrap();
        assert_eq!(
            set.source(0, &mut usize::MAX.clone()),
            Some(Source::Xds {
                resource: "limits".into()
            })
        );
    }
}
