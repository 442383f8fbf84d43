//! Where `/status.json`'s rules were written (`file:line`, or `xds:<resource>`), found
//! once per rule set and kept ([`Sources`]): apart from `status.rs`, so the handlers'
//! shared state (`admin_state.rs`) can hold the cache without naming the handler.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::rls::Compiled;
use crate::rules::{RuleSet, Source};

/// Bytes of rules text re-read to find the listed rules' lines (`rules/origin.rs`), once
/// per rule set ([`Sources`]): a line costs a parse of its file. Past it a rule names its
/// file without a line.
pub const LOCATE_BUDGET_BYTES: usize = 4 << 20;

fn source(set: &RuleSet, index: usize, budget: &mut usize) -> String {
    match set.source(index, budget) {
        Some(Source::File {
            file,
            line: Some(line),
        }) => format!("{file}:{line}"),
        Some(Source::File { file, line: None }) => file,
        Some(Source::Xds { resource }) => format!("xds:{resource}"),
        None => String::new(),
    }
}

/// The sources of the first `max` rules of `set`: `file:line`, lines found within
/// `budget` bytes of re-read text (past it, `file`), or `xds:<resource>`.
pub fn locate_sources(set: &RuleSet, max: usize, mut budget: usize) -> Vec<String> {
    (0..set.rules().len().min(max))
        .map(|i| source(set, i, &mut budget))
        .collect()
}

/// The listed rules' sources of the rule set in force, found when a set is first asked
/// about and kept until another is: the page asks every few seconds, and a set's lines do
/// not move. Only a weak reference to the set is kept, so a replaced set is not held.
#[derive(Default)]
pub struct Sources {
    last: Mutex<Option<Located>>,
}

/// A rule set, weakly, and its listed rules' sources.
type Located = (Weak<Compiled>, Arc<Vec<String>>);

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sources")
    }
}

impl Sources {
    /// The sources of `compiled`'s first `max` rules (`max` is the same on every call).
    pub fn of(&self, compiled: &Arc<Compiled>, max: usize) -> Arc<Vec<String>> {
        // Held while a new set's lines are found: a second caller waits for them rather
        // than finding them again.
        let mut last = self.last.lock();
        if let Some((set, sources)) = &*last {
            if set.upgrade().is_some_and(|c| Arc::ptr_eq(&c, compiled)) {
                return sources.clone();
            }
        }
        let sources = Arc::new(locate_sources(&compiled.rules, max, LOCATE_BUDGET_BYTES));
        *last = Some((Arc::downgrade(compiled), sources.clone()));
        sources
    }
}
