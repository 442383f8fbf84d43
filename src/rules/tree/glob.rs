//! A wildcard pattern matched by itself, for the shapes no index covers.

use super::work;

/// A pattern as its literal segments: `prefix*m1*m2*...*suffix`, empty middles dropped.
#[derive(Debug)]
pub(super) struct Glob {
    pub(super) prefix: Box<[u8]>,
    pub(super) middles: Vec<Box<[u8]>>,
    pub(super) suffix: Box<[u8]>,
    finders: Vec<memchr::memmem::Finder<'static>>,
}

impl Glob {
    /// `pattern` holds at least one `*`.
    pub(super) fn new(pattern: &[u8]) -> Glob {
        let mut segments: Vec<&[u8]> = pattern.split(|&c| c == b'*').collect();
        let suffix = segments.pop().unwrap_or_default().into();
        let prefix: Box<[u8]> = if segments.is_empty() {
            Box::default()
        } else {
            segments.remove(0).into()
        };
        let middles: Vec<Box<[u8]>> = segments
            .into_iter()
            .filter(|m| !m.is_empty())
            .map(Into::into)
            .collect();
        let finders = middles
            .iter()
            .map(|m| memchr::memmem::Finder::new(m).into_owned())
            .collect();
        Glob {
            prefix,
            middles,
            suffix,
            finders,
        }
    }

    /// Whether `value` matches: the prefix and suffix anchored, without overlapping, and
    /// each middle at its leftmost place after the one before. Taking the leftmost place
    /// is never wrong with `*` the only wildcard (any later place leaves less room for
    /// the rest), so this is one pass: O(value + pattern).
    pub(super) fn matches(&self, value: &[u8]) -> bool {
        let (p, s) = (self.prefix.len(), self.suffix.len());
        if value.len() < p + s || !value.starts_with(&self.prefix) || !value.ends_with(&self.suffix)
        {
            return false;
        }
        work::add((p + s) as u64);
        let mut rest = &value[p..value.len() - s];
        for f in &self.finders {
            let Some(at) = f.find(rest) else {
                work::add(rest.len() as u64);
                return false;
            };
            let end = at + f.needle().len();
            work::add(end as u64);
            rest = &rest[end..];
        }
        true
    }
}
