//! Where setting values come from, and how one is parsed: [`SettingsSource`] (the
//! environment, injected so tests never touch the process's own), and [`Values`], which looks
//! a setting up (flag, then variable, then default) and parses it, collecting every error.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::time::Duration;

use super::flags::{spec_of, ServeArgs};
use super::SettingsError;

/// Why a setting's value was refused: the words a [`SettingsError`] puts after the quoted
/// value (`'x' is not a boolean ...`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    /// Not one of the boolean spellings.
    #[error("is not a boolean (true/false, 1/0, yes/no, on/off)")]
    NotBoolean,
    /// Not a duration.
    #[error("is not a duration such as 100ms or 2s ({0})")]
    NotDuration(humantime::DurationError),
    /// A duration of zero where one is needed.
    #[error("is not longer than zero")]
    NotPositive,
    /// Not a whole number, or out of the type's range.
    #[error("is not a whole number in range")]
    NotWholeNumber,
    /// A number below its least value.
    #[error("is not at least {0}")]
    BelowLeast(usize),
    /// A number outside 0 to 1.
    #[error("is not between 0 and 1")]
    NotBetweenZeroAndOne,
    /// Not a number where a ratio is wanted.
    #[error("is not a number between 0 and 1")]
    NotRatio,
    /// Not a finite number where a sampling rate is wanted (any number is clamped to 0–1).
    #[error("is not a number (0 to 1)")]
    NotRate,
    /// A duration too long to count in milliseconds.
    #[error("is too long")]
    TooLong,
    /// None of the choices (listed in the canonical spelling).
    #[error("is not one of {}", .0.join(", "))]
    NotOneOf(&'static [&'static str]),
    /// Not an IP address and port.
    #[error("is not an IP address and port")]
    NotIpAndPort,
    /// Not an address and port, nor `:port`.
    #[error("is not an address and port (or :port)")]
    NotAddress,
    /// A header list entry without `:`.
    #[error("holds an entry that is not name:value")]
    NotNameValue,
    /// A header list entry whose name is not a (non-binary) header name.
    #[error("names '{0}', which is not a header name")]
    BadHeaderName(String),
    /// A header list entry whose value is not a header value.
    #[error("gives header '{0}' a value that is not a header value")]
    BadHeaderValue(String),
    /// An `https://` OTLP endpoint.
    #[error("is https: OTLP over TLS is not supported yet; use a plain http:// collector (a node agent or sidecar)")]
    OtlpTls,
    /// Not an `http://` URL.
    #[error("is not an http:// URL")]
    NotHttpUrl,
    /// A `LOG_LEVEL` directive the env-filter refuses (its words).
    #[error("is not a filter directive ({0})")]
    NotFilter(String),
    /// A duration that is not whole seconds of at least one (Envoy's TTLs).
    #[error("is not whole seconds of at least 1s")]
    NotWholeSeconds,
    /// A duration under a second.
    #[error("is less than 1s")]
    UnderASecond,
    /// Not a quota bucket action list (`RLQS_UNKNOWN_BUCKETS`).
    #[error("{0}")]
    NotBucketActions(String),
}

/// The environment settings are read from. main.rs passes the process's; tests pass a map.
pub trait SettingsSource {
    /// The value of variable `name`, if set.
    fn get(&self, name: &str) -> Option<String>;
}

impl SettingsSource for HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).cloned()
    }
}

impl SettingsSource for BTreeMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        BTreeMap::get(self, name).cloned()
    }
}

impl<const N: usize> SettingsSource for [(&str, &str); N] {
    fn get(&self, name: &str) -> Option<String> {
        self.iter()
            .rev()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}

/// No environment at all: every setting takes its flag or its default.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEnv;

impl SettingsSource for NoEnv {
    fn get(&self, _name: &str) -> Option<String> {
        None
    }
}

/// Reads settings for `Settings::resolve`: each lookup parses one value and records what is
/// wrong with it, so the caller gets every bad setting at once.
pub(super) struct Values<'a> {
    args: &'a ServeArgs,
    env: &'a dyn SettingsSource,
    pub(super) errors: Vec<SettingsError>,
}

impl<'a> Values<'a> {
    pub(super) fn new(args: &'a ServeArgs, env: &'a dyn SettingsSource) -> Self {
        Values {
            args,
            env,
            errors: Vec::new(),
        }
    }

    pub(super) fn error(&mut self, setting: &'static str, message: impl Into<String>) {
        self.errors.push(SettingsError {
            setting,
            message: message.into(),
        });
    }

    /// The raw value of `name`: its flag, else its variable, else its default. An empty
    /// variable counts as unset (templates often render a missing value as "").
    ///
    /// # Panics
    /// When `name` is not in the settings table (a programming error).
    pub(super) fn raw(&self, name: &str) -> Option<String> {
        let spec = spec_of(name).unwrap_or_else(|| panic!("{name} is not a serve setting"));
        self.args
            .flag(name)
            .map(str::to_string)
            .or_else(|| self.env.get(name).filter(|v| !v.trim().is_empty()))
            .or_else(|| spec.default.map(str::to_string))
    }

    /// `name` parsed by `parse`, which says what is wrong in words; `None` when unset or bad.
    pub(super) fn parse<T>(
        &mut self,
        name: &'static str,
        parse: impl FnOnce(&str) -> Result<T, ValueError>,
    ) -> Option<T> {
        let raw = self.raw(name)?;
        match parse(raw.trim()) {
            Ok(v) => Some(v),
            Err(why) => {
                // A secret's value never appears in an error (it goes to logs and terminals).
                let shown = match spec_of(name) {
                    Some(s) if s.secret => "<redacted>".to_string(),
                    _ => raw,
                };
                self.error(name, format!("'{shown}' {why}"));
                None
            }
        }
    }

    /// A setting with a default, parsed; `fallback` stands in when it is bad (the error is
    /// recorded, so the value is never used).
    pub(super) fn or<T>(
        &mut self,
        name: &'static str,
        fallback: T,
        parse: impl FnOnce(&str) -> Result<T, ValueError>,
    ) -> T {
        self.parse(name, parse).unwrap_or(fallback)
    }

    /// A string setting, as given.
    pub(super) fn text(&self, name: &str) -> String {
        self.raw(name).unwrap_or_default()
    }
}

/// A boolean in clap's and the reference's spellings: true/false, 1/0, yes/no, on/off, y/n,
/// t/f, in any case.
pub fn boolean(s: &str) -> Result<bool, ValueError> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "t" | "1" | "yes" | "y" | "on" => Ok(true),
        "false" | "f" | "0" | "no" | "n" | "off" => Ok(false),
        _ => Err(ValueError::NotBoolean),
    }
}

/// A duration such as `100ms`, `2s`, `1m 30s`.
pub fn duration(s: &str) -> Result<Duration, ValueError> {
    humantime::parse_duration(s).map_err(ValueError::NotDuration)
}

/// A duration that must be longer than zero.
pub fn positive_duration(s: &str) -> Result<Duration, ValueError> {
    match duration(s)? {
        d if d.is_zero() => Err(ValueError::NotPositive),
        d => Ok(d),
    }
}

/// A whole number of type `T`.
pub fn number<T: FromStr>(s: &str) -> Result<T, ValueError> {
    s.parse().map_err(|_| ValueError::NotWholeNumber)
}

/// A whole number of at least 1.
pub fn at_least_one<T: FromStr + PartialOrd + From<u8>>(s: &str) -> Result<T, ValueError> {
    match number::<T>(s)? {
        n if n < T::from(1) => Err(ValueError::BelowLeast(1)),
        n => Ok(n),
    }
}

/// A ratio between 0 and 1 inclusive.
pub fn ratio(s: &str) -> Result<f64, ValueError> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        Ok(_) => Err(ValueError::NotBetweenZeroAndOne),
        Err(_) => Err(ValueError::NotRatio),
    }
}

/// A signed duration (`-5s`): milliseconds.
pub fn signed_millis(s: &str) -> Result<i64, ValueError> {
    let (sign, body) = s.strip_prefix('-').map_or((1, s), |b| (-1, b));
    let d = duration(body)?;
    i64::try_from(d.as_millis())
        .map(|ms| ms * sign)
        .map_err(|_| ValueError::TooLong)
}

/// One of `choices`, case-insensitively; the canonical (listed) spelling.
pub fn one_of(
    choices: &'static [&'static str],
) -> impl Fn(&str) -> Result<&'static str, ValueError> {
    move |s| {
        choices
            .iter()
            .find(|c| c.eq_ignore_ascii_case(s))
            .copied()
            .ok_or(ValueError::NotOneOf(choices))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_say_what_is_wrong() {
        assert_eq!(boolean("On"), Ok(true));
        assert_eq!(boolean("0"), Ok(false));
        assert!(boolean("maybe").is_err());
        assert_eq!(duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(duration("xyz")
            .unwrap_err()
            .to_string()
            .starts_with("is not a duration such as 100ms or 2s ("));
        assert!(positive_duration("0s").is_err());
        assert_eq!(at_least_one::<u64>("0"), Err(ValueError::BelowLeast(1)));
        assert_eq!(ValueError::BelowLeast(1).to_string(), "is not at least 1");
        assert_eq!(
            one_of(&["SINGLE", "CLUSTER"])("x").unwrap_err().to_string(),
            "is not one of SINGLE, CLUSTER"
        );
        assert!(number::<u16>("70000").is_err());
        assert!(ratio("NaN").is_err() && ratio("1.5").is_err());
        assert_eq!(ratio("0.25"), Ok(0.25));
        assert_eq!(signed_millis("-5s"), Ok(-5000));
        assert_eq!(one_of(&["SINGLE", "CLUSTER"])("cluster"), Ok("CLUSTER"));
    }

    #[test]
    fn flag_beats_variable_beats_default_and_empty_is_unset() {
        let args = ServeArgs::default().with("GRPC_PORT", "1");
        let env = [("GRPC_PORT", "2"), ("PORT", "3"), ("HOST", "")];
        let v = Values::new(&args, &env);
        assert_eq!(v.raw("GRPC_PORT").as_deref(), Some("1"));
        assert_eq!(v.raw("PORT").as_deref(), Some("3"));
        assert_eq!(v.raw("HOST").as_deref(), Some("0.0.0.0"));
        assert_eq!(v.raw("CACHE_TTL"), None);
    }

    #[test]
    fn a_bad_secret_is_not_echoed() {
        let args = ServeArgs::default();
        let env = [("REDIS_AUTH", "hunter2")];
        let mut v = Values::new(&args, &env);
        assert_eq!(
            v.parse("REDIS_AUTH", |_| Err::<(), _>(ValueError::NotBoolean)),
            None
        );
        assert_eq!(
            v.errors[0].message,
            "'<redacted>' is not a boolean (true/false, 1/0, yes/no, on/off)"
        );
    }
}
