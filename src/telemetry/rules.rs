//! Per-rule counters with the reference's meaning: each rule's [`RuleStats`] (plain atomics,
//! looked up when rules are compiled, not per request) and the registry of every series,
//! the operator's kept apart from those made from client input and bounded
//! ([`SeriesBounds`]).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

/// Bounds of the series made from client input: request limit overrides (any client may
/// send one for a known domain) and `detailed_metric`/`value_to_metric` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeriesBounds {
    /// `METRICS_MAX_KEY_BYTES`: the longest client-made key, domain included, in bytes.
    /// A longer one keeps its first bytes and a hash of the whole ([`bounded_key`]).
    pub max_key_bytes: usize,
    /// `METRICS_MAX_CLIENT_SERIES`: most client-made series. Past it, hits are reported under
    /// the rule's own series (or the domain's `<domain>.override`), never lost.
    pub max_client_series: usize,
}

impl Default for SeriesBounds {
    fn default() -> Self {
        SeriesBounds {
            max_key_bytes: 512,
            max_client_series: 10_000,
        }
    }
}

/// The fewest bytes `METRICS_MAX_KEY_BYTES` may be: room for a prefix and the hash suffix.
pub const MIN_KEY_BYTES: usize = 64;

/// `key` cut to at most `max` bytes: the first bytes (on a character boundary), then `~`
/// and 16 hex digits of XXH3-64 of the whole key, so that distinct long keys stay distinct
/// series, and the same key gets the same name on every replica and after a restart.
pub fn bounded_key(key: &str, max: usize) -> std::borrow::Cow<'_, str> {
    const SUFFIX: usize = 17;
    if key.len() <= max {
        return key.into();
    }
    let mut cut = max.saturating_sub(SUFFIX);
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    let hash = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
    format!("{}~{hash:016x}", &key[..cut]).into()
}

/// Counters of one rule (or one detailed key), with the reference's meaning.
#[derive(Debug, Default)]
pub struct RuleStats {
    /// Hits seen.
    pub total_hits: AtomicU64,
    /// Hits over the limit.
    pub over_limit: AtomicU64,
    /// Hits within the limit but past `NEAR_LIMIT_RATIO` of it.
    pub near_limit: AtomicU64,
    /// Hits within the limit.
    pub within_limit: AtomicU64,
    /// Over-limit hits let through by shadow mode.
    pub shadow_mode: AtomicU64,
}

impl RuleStats {
    /// Adds `n` to one of the counters, saturating at `u64::MAX` as the decisions' own counts
    /// do: a client's `hits_addend` of 2^64−1 must not wrap a counter below where it was
    /// (Prometheus would read a reset).
    #[inline]
    pub fn add(counter: &AtomicU64, n: u64) {
        // The common case is one relaxed addition: a counter below 2^63 plus at most 2^32
        // cannot wrap, short of 2^31 additions landing between the load and the add.
        if n <= u64::from(u32::MAX) && counter.load(Ordering::Relaxed) < 1 << 63 {
            counter.fetch_add(n, Ordering::Relaxed);
        } else {
            let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(n))
            });
        }
    }
}

/// Reads one counter of a rule's stats.
pub type ReadCounter = fn(&RuleStats) -> u64;

/// A (domain, key) series name.
type SeriesKey = (String, String);

/// A client-made series and the operator series it belongs to (the rule's own key, or
/// `<domain>.override`): it goes when that one goes.
#[derive(Debug)]
struct ClientSeries {
    owner: String,
    stats: Labelled,
}

/// A series' stats and its labels as `/metrics` writes them (`domain="…",rule="…"`),
/// escaped once when the series is made: a scrape at 200,000 series would otherwise scan
/// and copy every name again.
#[derive(Debug, Clone)]
struct Labelled {
    stats: Arc<RuleStats>,
    labels: Arc<str>,
}

impl Labelled {
    fn pair(&self) -> (Arc<str>, Arc<RuleStats>) {
        (self.labels.clone(), self.stats.clone())
    }

    fn new((domain, key): &SeriesKey, stats: Arc<RuleStats>) -> Labelled {
        let labels = format!(
            "domain=\"{}\",rule=\"{}\"",
            super::label_value(domain),
            super::label_value(key)
        );
        Labelled {
            stats,
            labels: labels.into(),
        }
    }
}

#[derive(Debug, Default)]
struct Series {
    /// The operator's: one per rule in force (registered when the rules are compiled, so
    /// present from the start), and each domain's `<domain>.override` once used.
    rules: HashMap<SeriesKey, Labelled>,
    /// Made from client input, at most `max_client_series` of them.
    client: HashMap<SeriesKey, ClientSeries>,
}

/// Every rule's stats, keyed by (domain, stats key). The operator's series and the
/// client-made ones are kept apart, so a flood of client-made keys can never push out (or
/// stand in for) the operator's; a series lives as long as its rule is in force, so counters
/// of unchanged rules stay monotonic across reloads, as Prometheus expects, and removed
/// rules' series go ([`RuleStatsRegistry::retain_rules`]).
#[derive(Debug, Default)]
pub struct RuleStatsRegistry {
    series: RwLock<Series>,
    bounds: RwLock<SeriesBounds>,
}

impl RuleStatsRegistry {
    /// Sets the bounds of client-made series (from the settings); series already made stay.
    pub fn set_bounds(&self, bounds: SeriesBounds) {
        *self.bounds.write() = bounds;
    }

    /// The bounds of client-made series.
    pub fn bounds(&self) -> SeriesBounds {
        *self.bounds.read()
    }

    /// The stats of an operator series (a rule's own key), created on first use. A
    /// client-made series of the same name becomes the operator's, counts and all.
    pub fn get(&self, domain: &str, key: &str) -> Arc<RuleStats> {
        let name = (domain.to_string(), key.to_string());
        if let Some(s) = self.series.read().rules.get(&name) {
            return s.stats.clone();
        }
        let mut series = self.series.write();
        let promoted = series.client.remove(&name).map(|c| c.stats);
        match series.rules.entry(name) {
            Entry::Occupied(s) => s.get().stats.clone(),
            Entry::Vacant(v) => {
                let s = promoted.unwrap_or_else(|| Labelled::new(v.key(), Arc::default()));
                v.insert(s).stats.clone()
            }
        }
    }

    /// The stats of a client-made key (cut to `max_key_bytes`), belonging to the operator
    /// series `owner`; `None` when `max_client_series` are already tracked and this key is
    /// not one of them: the caller then counts under `owner`.
    pub fn get_client(&self, domain: &str, key: &str, owner: &str) -> Option<Arc<RuleStats>> {
        let bounds = self.bounds();
        let name = (
            domain.to_string(),
            bounded_key(key, bounds.max_key_bytes).into_owned(),
        );
        {
            let series = self.series.read();
            if let Some(s) = series.rules.get(&name) {
                return Some(s.stats.clone());
            }
            if let Some(c) = series.client.get(&name) {
                return Some(c.stats.stats.clone());
            }
            if series.client.len() >= bounds.max_client_series {
                return None;
            }
        }
        let mut series = self.series.write();
        if let Some(s) = series.rules.get(&name) {
            return Some(s.stats.clone());
        }
        let full = series.client.len() >= bounds.max_client_series;
        match series.client.entry(name) {
            Entry::Occupied(c) => Some(c.get().stats.stats.clone()),
            Entry::Vacant(_) if full => None,
            Entry::Vacant(v) => {
                let stats = Labelled::new(v.key(), Arc::default());
                let owner = owner.to_string();
                Some(v.insert(ClientSeries { owner, stats }).stats.stats.clone())
            }
        }
    }

    /// Keeps the operator series for which `keep(domain, key)` holds, and the client-made
    /// series whose owner is kept; drops the rest (the series of rules a reload removed).
    pub fn retain_rules(&self, keep: impl Fn(&str, &str) -> bool) {
        let mut series = self.series.write();
        series.rules.retain(|(d, k), _| keep(d, k));
        series.client.retain(|(d, _), c| keep(d, &c.owner));
    }

    /// How many series there are: (operator, client-made).
    pub fn len(&self) -> (usize, usize) {
        let series = self.series.read();
        (series.rules.len(), series.client.len())
    }

    /// Every series' stats, the operator's first, each part sorted by name.
    pub fn snapshot(&self) -> Vec<(SeriesKey, Arc<RuleStats>)> {
        let series = self.series.read();
        let mut rules: Vec<_> = series
            .rules
            .iter()
            .map(|(k, v)| (k.clone(), v.stats.clone()))
            .collect();
        let mut client: Vec<_> = series
            .client
            .iter()
            .map(|(k, c)| (k.clone(), c.stats.stats.clone()))
            .collect();
        drop(series);
        rules.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        client.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        rules.extend(client);
        rules
    }

    /// Every series' `/metrics` labels and stats, the operator's first, each part sorted by
    /// its labels: two reference counts each under the lock, so a scrape holds it for as short a time
    /// as it can (a rule's first client-made series waits for it on the request path).
    pub fn labelled(&self) -> Vec<(Arc<str>, Arc<RuleStats>)> {
        let series = self.series.read();
        let mut rules: Vec<_> = series.rules.values().map(Labelled::pair).collect();
        let mut client: Vec<_> = series.client.values().map(|c| c.stats.pair()).collect();
        drop(series);
        rules.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        client.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        rules.extend(client);
        rules
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_made_series_are_bounded_apart_from_the_operators() {
        let r = RuleStatsRegistry::default();
        r.set_bounds(SeriesBounds {
            max_key_bytes: 64,
            max_client_series: 3,
        });
        let own = r.get("d", "d.k");
        for i in 0..3 {
            assert!(r.get_client("d", &format!("d.k_{i}"), "d.k").is_some());
        }
        assert!(r.get_client("d", "d.k_one-too-many", "d.k").is_none());
        assert!(
            r.get_client("d", "d.k_1", "d.k").is_some(),
            "known keys stay available"
        );
        // Operator series are never refused, and a client key naming one shares it.
        let other = r.get("d", "d.other");
        assert!(Arc::ptr_eq(
            &r.get_client("d", "d.other", "d.k").unwrap(),
            &other
        ));
        assert!(!Arc::ptr_eq(&own, &other));
        assert_eq!(r.len(), (2, 3));
        // A reload that removes d.k drops its client-made series with it.
        r.retain_rules(|_, k| k == "d.other");
        assert_eq!(r.len(), (1, 0));
    }

    #[test]
    fn long_keys_are_cut_with_a_stable_hash() {
        let a = format!("d.k_{}", "é".repeat(100));
        let b = format!("{a}x");
        let (ka, kb) = (bounded_key(&a, 64), bounded_key(&b, 64));
        assert!(ka.len() <= 64 && kb.len() <= 64, "{ka} {kb}");
        assert_ne!(ka, kb);
        assert_eq!(ka, bounded_key(&a, 64), "the same key, the same name");
        assert!(ka.starts_with("d.k_é"));
        assert_eq!(bounded_key("d.k_v", 64), "d.k_v");
    }

    #[test]
    fn counters_saturate() {
        let c = AtomicU64::new(5);
        RuleStats::add(&c, u64::MAX);
        assert_eq!(c.load(Ordering::Relaxed), u64::MAX);
        RuleStats::add(&c, 1);
        assert_eq!(c.load(Ordering::Relaxed), u64::MAX);
        let c = AtomicU64::new(u64::MAX - 1);
        RuleStats::add(&c, 7);
        assert_eq!(c.load(Ordering::Relaxed), u64::MAX);
    }
}
