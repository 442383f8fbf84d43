//! `overrides` (docs/rules.md, "Overrides") against what they stand for: a rules file with a
//! rule's overrides and the same file with a descriptor per overridden value instead answer
//! every request alike (statuses, remaining, resets, headers, dynamic metadata, overall code),
//! count the same metric series, and resolve every descriptor and quota bucket to equal rules
//! and the same counter (so global mode's Redis keys and RLQS's counters are the same too).
//! Plus a reload that changes one override.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use proptest::prelude::*;
use sluice::core::clock::ManualClock;
use sluice::rls::{HeaderNames, Options, RateLimiter};
use sluice::rules::Rule;

use crate::common::{desc, T0};

/// The request values: `t-0` to `t-7` match the rule's wildcard `t-*`, `x` only a key-only
/// rule; overrides name `t-0` to `t-5`.
const VALUES: [&str; 9] = ["t-0", "t-1", "t-2", "t-3", "t-4", "t-5", "t-6", "t-7", "x"];

/// One limit, as a flow mapping of `rate_limit`'s limit keys.
#[derive(Debug, Clone)]
struct LimitYaml {
    unit: &'static str,
    requests_per_unit: u32,
    unit_multiplier: u32,
    algorithm: &'static str,
    burst: Option<u32>,
    strict: Option<bool>,
}

impl LimitYaml {
    /// The keys, without braces.
    fn keys(&self) -> String {
        let mut k = format!(
            "unit: {}, requests_per_unit: {}, unit_multiplier: {}, algorithm: {}",
            self.unit, self.requests_per_unit, self.unit_multiplier, self.algorithm
        );
        if let Some(b) = self.burst {
            k += &format!(", burst: {b}");
        }
        if let Some(s) = self.strict {
            k += &format!(", strict: {s}");
        }
        k
    }
}

fn arb_limit() -> impl Strategy<Value = LimitYaml> {
    (
        prop_oneof![Just("second"), Just("minute")],
        0u32..6,
        1u32..3,
        prop_oneof![
            Just("sliding_window"),
            Just("fixed_window"),
            Just("token_bucket")
        ],
        proptest::option::of(0u32..8),
        proptest::option::of(any::<bool>()),
    )
        .prop_map(|(unit, rpu, mult, algorithm, burst, strict)| LimitYaml {
            unit,
            requests_per_unit: rpu,
            unit_multiplier: mult,
            algorithm,
            burst: burst.filter(|_| algorithm == "token_bucket"),
            strict,
        })
}

/// An override: a bare count, or a whole limit.
#[derive(Debug, Clone)]
enum Override {
    Count(u32),
    Limit(LimitYaml),
}

/// The rule under test and what surrounds it.
#[derive(Debug, Clone)]
struct Case {
    /// `value: "t-*"` (else key-only), and `share_threshold` on it.
    wildcard: bool,
    share: bool,
    /// An earlier wildcard `t-1*` at the same level, which takes `t-1` from a key-only rule.
    earlier: bool,
    /// The rule sits below a key-only `route` level.
    nested: bool,
    limit: LimitYaml,
    additional: Option<LimitYaml>,
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
    value_to_metric: bool,
    /// The rule replaces the `other` rule's limit.
    replaces: bool,
    overrides: BTreeMap<usize, Override>,
}

impl Case {
    /// The rules file: with `overrides`, or with a descriptor per overridden value.
    fn yaml(&self, expanded: bool) -> String {
        let pad = if self.nested { "    " } else { "" };
        let mut level = String::new();
        if self.earlier {
            level +=
                "- key: t\n  value: \"t-1*\"\n  rate_limit: {unit: second, requests_per_unit: 3}\n";
        }
        let value = if self.wildcard {
            "  value: \"t-*\"\n"
        } else {
            ""
        };
        let share = if self.share && self.wildcard {
            "  share_threshold: true\n"
        } else {
            ""
        };
        level += &format!("- key: t\n{value}{share}{}", self.body(&self.limit.keys()));
        if !expanded && !self.overrides.is_empty() {
            level += "  overrides:\n";
            for (&v, o) in &self.overrides {
                let limit = match o {
                    Override::Count(n) => n.to_string(),
                    Override::Limit(l) => format!("{{{}}}", l.keys()),
                };
                level += &format!("    {}: {limit}\n", VALUES[v]);
            }
        }
        if expanded {
            for (&v, o) in &self.overrides {
                let limit = match o {
                    Override::Count(n) => LimitYaml {
                        requests_per_unit: *n,
                        ..self.limit.clone()
                    },
                    Override::Limit(l) => l.clone(),
                };
                level += &format!(
                    "- key: t\n  value: {}\n{}",
                    VALUES[v],
                    self.body(&limit.keys())
                );
            }
        }
        let level: String = level.lines().map(|l| format!("  {pad}{l}\n")).collect();
        let route = if self.nested {
            "  - key: route\n    descriptors:\n"
        } else {
            ""
        };
        format!(
            "domain: d\ndescriptors:\n  - key: other\n    rate_limit: {{unit: minute, requests_per_unit: 2, name: other}}\n{route}{level}"
        )
    }

    /// A `t` descriptor's lines after its key and value, with `limit` as its own.
    fn body(&self, limit: &str) -> String {
        let mut b = String::new();
        for (on, key) in [
            (self.shadow_mode, "shadow_mode"),
            (self.quota_mode, "quota_mode"),
            (self.detailed_metric, "detailed_metric"),
            (self.value_to_metric, "value_to_metric"),
        ] {
            if on {
                b += &format!("  {key}: true\n");
            }
        }
        b += "  metadata: {tier: gold}\n";
        let replaces = if self.replaces {
            ", replaces: [{name: other}]"
        } else {
            ""
        };
        b += &format!("  rate_limit: {{{limit}, name: t{replaces}}}\n");
        if let Some(a) = &self.additional {
            b += &format!("  additional_limits:\n    - {{{}}}\n", a.keys());
        }
        b
    }

    /// The `t` descriptor's entries for the value at `v`.
    fn entries(&self, v: usize, route: bool) -> Vec<(&'static str, &'static str)> {
        let mut e = Vec::new();
        if self.nested {
            e.push(("route", if route { "r1" } else { "r2" }));
        }
        e.push(("t", VALUES[v]));
        e
    }
}

fn arb_case() -> impl Strategy<Value = Case> {
    let override_ = prop_oneof![
        (0u32..6).prop_map(Override::Count),
        arb_limit().prop_map(Override::Limit)
    ];
    (
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        arb_limit(),
        proptest::option::of(arb_limit()),
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        any::<bool>(),
        prop::collection::btree_map(0usize..6, override_, 1..5),
    )
        .prop_map(
            |(
                (wildcard, share, earlier, nested),
                limit,
                additional,
                flags,
                replaces,
                overrides,
            )| {
                Case {
                    wildcard,
                    share,
                    earlier,
                    nested,
                    limit,
                    additional,
                    shadow_mode: flags.0,
                    quota_mode: flags.1,
                    detailed_metric: flags.2,
                    value_to_metric: flags.3,
                    replaces,
                    overrides,
                }
            },
        )
}

/// One request: the value's position in [`VALUES`], its `hits_addend`, whether the `other`
/// descriptor comes too, the route, and the milliseconds to wait before it.
type Step = (usize, u64, bool, bool, u64);

fn arb_steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            0..VALUES.len(),
            0u64..3,
            any::<bool>(),
            any::<bool>(),
            0u64..1500,
        ),
        1..60,
    )
}

fn limiter(yaml: &str, clock: &ManualClock) -> Arc<RateLimiter> {
    let opts = Options {
        response_headers: Some(HeaderNames::default()),
        dynamic_metadata: true,
        ..Options::default()
    };
    RateLimiter::local(yaml, Arc::new(clock.clone()), opts)
        .unwrap_or_else(|e| panic!("{e:?} in\n{yaml}"))
}

/// Every metric series: its name and its five counts.
fn series(l: &RateLimiter) -> Vec<((String, String), [u64; 5])> {
    use std::sync::atomic::Ordering::Relaxed;
    l.telemetry()
        .rules
        .snapshot()
        .into_iter()
        .map(|(name, s)| {
            let counts = [
                &s.total_hits,
                &s.over_limit,
                &s.near_limit,
                &s.within_limit,
                &s.shadow_mode,
            ]
            .map(|c| c.load(Relaxed));
            (name, counts)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn overrides_answer_as_a_descriptor_per_value_does(case in arb_case(), steps in arb_steps()) {
        let (with, expanded) = (case.yaml(false), case.yaml(true));
        let (clock_a, clock_b) = (ManualClock::new(T0), ManualClock::new(T0));
        let (a, b) = (limiter(&with, &clock_a), limiter(&expanded, &clock_b));
        for (v, hits, other, route, wait) in steps {
            clock_a.advance_ms(wait);
            clock_b.advance_ms(wait);
            let entries = case.entries(v, route);
            let mut d: RateLimitDescriptor = desc(&entries);
            d.hits_addend = Some(UInt64Value { value: hits });
            let mut descriptors = vec![d];
            if other {
                descriptors.push(desc(&[("other", "o")]));
            }
            let req = RateLimitRequest { domain: "d".into(), descriptors, hits_addend: 0 };
            prop_assert_eq!(
                a.should_rate_limit(&req).unwrap(),
                b.should_rate_limit(&req).unwrap(),
                "{:?} in\n{}\nagainst\n{}", entries, with, expanded
            );
            // The same rule (but for knowing whose override it is) and counter for the
            // descriptor and for the quota bucket.
            let plain = |r: &Rule| Rule { override_of: None, ..r.clone() };
            let (ra, rb) = (a.rules(), b.rules());
            let (fa, fb) = (ra.rules.find("d", &entries), rb.rules.find("d", &entries));
            prop_assert_eq!(fa.map(|m| (plain(m.rule), m.entity)), fb.map(|m| (plain(m.rule), m.entity)));
            let bucket: HashMap<&str, &str> = entries.iter().copied().collect();
            let (ba, bb) = (ra.rules.find_bucket("d", &bucket), rb.rules.find_bucket("d", &bucket));
            prop_assert_eq!(ba.map(|m| (plain(m.rule), m.entity)), bb.map(|m| (plain(m.rule), m.entity)));
        }
        prop_assert_eq!(series(&a), series(&b));
        // `/rlconfig` lists the same rules (in another order: an override's rule comes right
        // after its own).
        let lines = |l: &RateLimiter| {
            let mut v: Vec<String> = l.rules().rules.dump().lines().map(String::from).collect();
            v.sort();
            v
        };
        prop_assert_eq!(lines(&a), lines(&b));
    }
}

/// Remaining hits for `tenant` in a one-descriptor request of one hit.
fn remaining(l: &RateLimiter, tenant: &str) -> u32 {
    let req = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![desc(&[("tenant", tenant)])],
        hits_addend: 0,
    };
    l.should_rate_limit(&req).unwrap().statuses[0].limit_remaining
}

#[test]
fn a_reload_that_changes_one_override_keeps_the_others_counters() {
    let rules = |acme: u32| {
        format!("domain: d\ndescriptors:\n  - key: tenant\n    rate_limit: {{unit: minute, requests_per_unit: 3}}\n    overrides:\n      acme: {acme}\n      beta: 10\n")
    };
    let clock = ManualClock::new(T0);
    let l = limiter(&rules(5), &clock);
    assert_eq!(
        [
            remaining(&l, "acme"),
            remaining(&l, "beta"),
            remaining(&l, "other")
        ],
        [4, 9, 2]
    );
    let set = sluice::rules::compile_sources(&[("r.yaml".into(), rules(6))], false).unwrap();
    l.swap_rules(set, vec![]);
    // The changed override is a new rule with a fresh counter; the others count on.
    assert_eq!(
        [
            remaining(&l, "acme"),
            remaining(&l, "beta"),
            remaining(&l, "other")
        ],
        [5, 8, 1]
    );
}
