//! A rules file of several YAML documents, read as envoyproxy/ratelimit reads it: the first
//! document only (go-yaml v2's `yaml.Unmarshal` parses one). A later document that holds
//! anything is named in a warning, since its rules are never loaded; an empty one (a file
//! ending in `---`) is not worth one.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, Visitor};

use super::error::ConfigError;

/// The first document of `content`, to decode from; empty when `content` is.
pub(crate) fn first(content: &str) -> serde_yaml::Deserializer<'_> {
    // A text always has a first document (an empty one, when it holds nothing), so the
    // fallback, an empty text, is there for the type's sake.
    serde_yaml::Deserializer::from_str(content)
        .next()
        .unwrap_or_else(|| serde_yaml::Deserializer::from_str(""))
}

/// The warning for the documents of `file` after the first (`later`, what the first left of
/// the document iterator), when any of them holds something: it names the first such one,
/// and how many more there are.
pub(crate) fn ignored<'a>(
    file: &str,
    later: impl Iterator<Item = serde_yaml::Deserializer<'a>>,
) -> Option<ConfigError> {
    let mut first_at = None;
    let mut more = 0usize;
    for document in later {
        let e = match Empty::deserialize(document) {
            Ok(Empty) => continue,
            Err(e) => e,
        };
        let not_empty = e.to_string().contains(NOT_EMPTY);
        if first_at.is_none() {
            first_at = Some(e.location());
        } else if not_empty {
            more += 1;
        }
        // A syntax error ends the stream (the iterator would yield it again and again); it
        // is the document that was being read, already counted when it began.
        if !not_empty {
            break;
        }
    }
    let at = first_at?;
    let others = match more {
        0 => String::new(),
        n => format!(" (and {n} more after it)"),
    };
    let mut warning = ConfigError::new(
        file,
        format!(
            "only the first YAML document of a file is read, as envoyproxy/ratelimit reads it: \
             this document is ignored{others}; put each domain in a file of its own"
        ),
    );
    if let Some(at) = at {
        warning.line = u32::try_from(at.line()).ok();
        warning.column = u32::try_from(at.column()).ok();
    }
    Some(warning)
}

/// The message of a document that holds something; any other error is the parser's.
const NOT_EMPTY: &str = "sluice-document-not-empty";

/// A document that holds nothing (or a null).
struct Empty;

impl<'de> Deserialize<'de> for Empty {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EmptyVisitor)
    }
}

struct EmptyVisitor;

impl<'de> Visitor<'de> for EmptyVisitor {
    type Value = Empty;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an empty document")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Empty, E> {
        Ok(Empty)
    }

    fn visit_none<E: de::Error>(self) -> Result<Empty, E> {
        Ok(Empty)
    }

    // Anything else: the error carries the position of the node it is about.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Empty, E> {
        Err(E::custom(NOT_EMPTY))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Empty, E> {
        Err(E::custom(NOT_EMPTY))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Empty, E> {
        Err(E::custom(NOT_EMPTY))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Empty, E> {
        Err(E::custom(NOT_EMPTY))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Empty, E> {
        Err(E::custom(NOT_EMPTY))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Empty, A::Error> {
        Err(de::Error::custom(NOT_EMPTY))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<Empty, A::Error> {
        Err(de::Error::custom(NOT_EMPTY))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warning(text: &str) -> Option<String> {
        let mut documents = serde_yaml::Deserializer::from_str(text);
        documents.next();
        ignored("f.yaml", documents).map(|w| w.to_string())
    }

    #[test]
    fn an_empty_trailing_document_is_fine_and_a_full_one_is_named() {
        assert_eq!(warning("domain: d\n"), None);
        assert_eq!(warning("domain: d\n---\n"), None);
        assert_eq!(warning("domain: d\n---\n# nothing\n...\n"), None);
        let ignored = "f.yaml: only the first YAML document of a file is read, as \
                       envoyproxy/ratelimit reads it: this document is ignored";
        assert_eq!(
            warning("domain: d\n---\n---\ndomain: e\n").as_deref(),
            Some(
                format!("{ignored}; put each domain in a file of its own (line 4, column 1)")
                    .as_str()
            )
        );
        assert_eq!(
            warning("domain: d\n---\ndomain: e\n---\ndomain: f\n---\nx\n").as_deref(),
            Some(format!("{ignored} (and 2 more after it); put each domain in a file of its own (line 3, column 1)").as_str())
        );
        // A later document that does not even parse is ignored too, and ends the stream.
        let broken = warning("domain: d\n---\ndomain: [\n").unwrap();
        assert!(
            broken.ends_with("ignored; put each domain in a file of its own (line 3, column 1)"),
            "{broken}"
        );
    }
}
