//! Where a node of a rules file is in its text: the line and column of an error's subject.
//!
//! serde_yaml keeps no positions in a `Value`, but its errors carry the position of the node
//! being decoded when they were raised. [`locate`] decodes the text once more with a seed that
//! walks a [`Step`] path and fails on purpose at its end, then reads the position off that
//! error: it is libyaml's own mark, exact for block and flow style, quoted keys, anchors and
//! all. Each lookup re-reads the whole file, so only errors are located, and at most
//! `error::LOCATE_BUDGET_BYTES` of text per file: a large file full of mistakes still fails
//! fast (its later errors keep their descriptor path, without a line).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// One step from a node to one of its children.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Step {
    /// Into the value of this key of a mapping.
    Key(&'static str),
    /// Into this entry of a sequence.
    Index(usize),
    /// The key itself, as written in the mapping (where a misplaced or wrong key is).
    KeyItself(String),
    /// Into the value of the mapping's entry at this position (keys that are data, such as
    /// `overrides`' values, may repeat or be numbers: their position tells them apart).
    Entry(usize),
    /// The key of the mapping's entry at this position, itself.
    EntryKey(usize),
}

/// The message of the deliberate error; anything else ends the lookup without a position.
const HERE: &str = "sluice-locate-here";

/// The 1-based line and column of the node at `path` in `content`. A path that runs past the
/// document (a key that is absent, an index past the end) stops at the deepest node it
/// reached, so an error about a missing key points at the mapping that lacks it.
pub fn locate(content: &str, path: &[Step]) -> Option<(u32, u32)> {
    let err = Seek { rest: path }
        .deserialize(serde_yaml::Deserializer::from_str(content))
        .err()?;
    // serde_yaml puts the node's path before the message: `descriptors[0]: <HERE>`.
    if !err.to_string().contains(HERE) {
        return None;
    }
    let at = err.location()?;
    Some((
        u32::try_from(at.line()).ok()?,
        u32::try_from(at.column()).ok()?,
    ))
}

fn here<E: de::Error>() -> E {
    E::custom(HERE)
}

/// Walks `rest` and fails at its end (or where the document stops short of it).
struct Seek<'p> {
    rest: &'p [Step],
}

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any node")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (want, itself) = match self.rest.first() {
            Some(Step::Key(k)) => (*k, false),
            Some(Step::KeyItself(k)) => (k.as_str(), true),
            Some(&Step::Entry(i)) => return self.entry(map, i, false),
            Some(&Step::EntryKey(i)) => return self.entry(map, i, true),
            Some(Step::Index(_)) | None => return Err(here()),
        };
        while let Some(found) = map.next_key_seed(KeySeed { want, itself })? {
            if found {
                return map.next_value_seed(Seek {
                    rest: &self.rest[1..],
                });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Err(here())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some(Step::Index(i)) = self.rest.first() else {
            return Err(here());
        };
        for _ in 0..*i {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Err(here());
            }
        }
        match seq.next_element_seed(Seek {
            rest: &self.rest[1..],
        })? {
            Some(()) => Ok(()),
            None => Err(here()),
        }
    }

    // A scalar, null or an empty value: the walk ends here whatever is left of the path.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(here())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(here())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(here())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(here())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(here())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(here())
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Err(here())
    }
}

impl Seek<'_> {
    /// Into the `i`th entry of `map`: its key itself, or on along its value.
    fn entry<'de, A: MapAccess<'de>>(
        self,
        mut map: A,
        i: usize,
        itself: bool,
    ) -> Result<(), A::Error> {
        for _ in 0..i {
            if map.next_entry::<IgnoredAny, IgnoredAny>()?.is_none() {
                return Err(here());
            }
        }
        if itself {
            // A walk with no steps left fails on the node it is given: the key.
            map.next_key_seed(Seek { rest: &[] })?;
            return Err(here());
        }
        if map.next_key::<IgnoredAny>()?.is_none() {
            return Err(here());
        }
        map.next_value_seed(Seek {
            rest: &self.rest[1..],
        })
    }
}

/// A mapping key: whether it is `want`; with `itself`, fails *on* the key when it is, so the
/// position is the key's.
struct KeySeed<'a> {
    want: &'a str,
    itself: bool,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        match (v == self.want, self.itself) {
            (true, true) => Err(here()),
            (matched, _) => Ok(matched),
        }
    }

    // Keys that are not strings are never the one sought.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_none<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_descriptors_keys_and_values_in_block_and_flow_style() {
        let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: minute\n  # a comment\n  - key: b\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n    descriptors:\n      - {key: c, value: x}\n";
        let descriptor = |i| vec![Step::Key("descriptors"), Step::Index(i)];
        assert_eq!(locate(text, &descriptor(0)), Some((3, 5)));
        assert_eq!(locate(text, &descriptor(1)), Some((7, 5)));
        let mut unit = descriptor(1);
        unit.extend([Step::Key("rate_limit"), Step::KeyItself("unit".into())]);
        assert_eq!(locate(text, &unit), Some((8, 18)));
        let mut inner = descriptor(1);
        inner.extend([Step::Key("descriptors"), Step::Index(0)]);
        assert_eq!(locate(text, &inner), Some((10, 9)));
        // A key that is not there: the mapping that lacks it.
        let mut missing = descriptor(0);
        missing.extend([
            Step::Key("rate_limit"),
            Step::KeyItself("requests_per_unit".into()),
        ]);
        assert_eq!(locate(text, &missing), Some((5, 7)));
        // An index past the end: the sequence; a path through a scalar: the scalar.
        assert_eq!(locate(text, &descriptor(9)), Some((3, 3)));
        let mut through = descriptor(0);
        through.extend([Step::Key("key"), Step::Index(0)]);
        assert_eq!(locate(text, &through), Some((3, 10)));
    }
}
