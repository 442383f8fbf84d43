//! `POST /explain` and `sluice explain`: what a `ShouldRateLimit` request would be answered
//! now, and why, charging nothing in any mode: [`explain`], handed what it uses
//! ([`Explaining`]) by [`RateLimiter::explain`](super::RateLimiter::explain), which gates and
//! validates the request first.
//!
//! Each descriptor is resolved as a request's is (`resolve.rs`, `replaces` included) but
//! without making metric series, and each limit is checked on a *copy* of its entity's
//! states: an entity this replica holds is read under its shard's lock (its recency
//! unchanged), one it does not hold is looked at on fresh states, as a first request would
//! find it, and never created. Nothing is queued for the sync either. Exact rules in global
//! mode are read from the store with the exact script's read-only call (`commit` off: GETs
//! only), since their counts live there; when it fails, from memory, and the answer says so.
//! The overall code is `respond.rs`'s, on these outcomes. [`look_on`] is how `/top` reads
//! a key too (`top.rs`).

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde::Serialize;

use super::exact::natural;
use super::resolve::{replaced_by, request_override, Target};
use super::{hits_of, respond, Compiled, Options};
use crate::core::clock::UnixMillis;
use crate::core::decide::{pick, Outcome};
use crate::core::table::EntityTable;
use crate::core::{Algorithm, FleetView, LimitState, Verdict};
use crate::global::{ExactClient, ExactItem, Fleet};
use crate::rules::{Rule, Source};
use crate::telemetry::RuleStats;

/// Bytes of rules text one explanation may re-read to find its rules' lines (`rules/origin.rs`):
/// a line costs a parse of its file, and the admin port takes requests from anyone who
/// reaches it.
const LOCATE_BUDGET_BYTES: usize = 4 << 20;

/// What a request would be answered, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// The request's domain.
    pub domain: String,
    /// The overall code `/json` and gRPC would answer now (`OK` or `OVER_LIMIT`).
    pub overall_code: &'static str,
    /// Global `SHADOW_MODE` is on: an overall `OVER_LIMIT` is answered `OK`.
    pub shadow_mode: bool,
    /// Always `false`: nothing was counted, refunded or created.
    pub charged: bool,
    /// Per descriptor, in the request's order.
    pub descriptors: Vec<DescriptorExplanation>,
}

/// One descriptor's rule (or why none) and its limits.
#[derive(Debug, Clone, Serialize)]
pub struct DescriptorExplanation {
    /// The descriptor's entries.
    pub entries: Vec<EntryJson>,
    /// The hits the request would add (`hits_addend`, as a request's are read).
    pub hits: u64,
    /// The request gives hits back (`is_negative_hits`): checked with none added.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refund: bool,
    /// The rule that matched, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<RuleJson>,
    /// Why no rule matched, when none did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_match: Option<NoMatchJson>,
    /// The rule matched but another rule of the request `replaces` it (its `full_key`): it
    /// counts nothing in this request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaced_by: Option<String>,
    /// Per limit of the rule, in its order (empty without a rule, or unlimited).
    pub limits: Vec<LimitJson>,
    /// The decision on the rule's limits: `OK` or `OVER_LIMIT`.
    pub decision: &'static str,
    /// The status code answered for it: `OK` when the rule's `shadow_mode` turns an
    /// `OVER_LIMIT` decision to `OK`.
    pub code: &'static str,
}

/// A descriptor entry.
#[derive(Debug, Clone, Serialize)]
pub struct EntryJson {
    /// Its key.
    pub key: String,
    /// Its value.
    pub value: String,
}

/// The rule a descriptor matched.
#[derive(Debug, Clone, Serialize)]
pub struct RuleJson {
    /// `rate_limit.name` (empty when unnamed).
    pub name: String,
    /// Its path in the tree, as metrics name it (`domain.key_value.key2`).
    pub full_key: String,
    /// Where it was written: `{"file", "line"}` or `{"xds"}`; `request` for a limit the
    /// request supplied.
    pub source: SourceJson,
    /// For one of a rule's `overrides`, that rule's `full_key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub override_of: Option<String>,
    /// Never counted or denied.
    pub unlimited: bool,
    /// The rule's `shadow_mode`.
    pub shadow_mode: bool,
    /// The rule's `quota_mode`.
    pub quota_mode: bool,
    /// `exact: true` in global mode: where the counts came from, `store` (a read-only store
    /// call) or `memory` (the store failed; with the reason).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
}

/// Where a rule was written.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum SourceJson {
    /// A rules file and its descriptor's line (`null` when not found within the budget).
    File {
        /// The file's name as loaded.
        file: String,
        /// The 1-based line of the rule's descriptor (an override: its value).
        line: Option<u32>,
    },
    /// An xDS resource.
    Xds {
        /// Its name.
        xds: String,
    },
    /// A limit the request supplied (`limit` in the descriptor).
    Request {
        /// Always true.
        request: bool,
    },
}

/// Why a descriptor matched no rule.
#[derive(Debug, Clone, Serialize)]
pub struct NoMatchJson {
    /// `no_entries`, `unknown_domain`, `no_key`, `no_value` or `no_limit`.
    pub reason: &'static str,
    /// The entry where the walk stopped, from 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<usize>,
    /// Its key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Its value (not for `no_key`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The reason in words.
    pub message: String,
}

/// One limit as it stands now.
#[derive(Debug, Clone, Serialize)]
pub struct LimitJson {
    /// `sliding_window`, `fixed_window`, `token_bucket` or `concurrency`.
    pub algorithm: &'static str,
    /// A token bucket's capacity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Hits a window (a bucket: tokens refilled a window).
    pub requests_per_unit: u32,
    /// The unit reported to Envoy (`SECOND` ... `YEAR`).
    pub unit: &'static str,
    /// Units in a window, when not 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit_multiplier: Option<u64>,
    /// The count as this replica sees the fleet's, before this request (a bucket: tokens in
    /// use).
    pub count: u64,
    /// Hits left before this request.
    pub remaining: u32,
    /// Seconds until the window ends (a bucket: until it is full).
    pub reset_seconds: u64,
    /// What this request's hits would get on this limit: `OK` or `OVER_LIMIT`.
    pub decision: &'static str,
}

/// A limit's verdicts: as it stands (no hits), and with the request's hits.
pub(super) type Looks = Vec<(Verdict, Verdict)>;

/// What explaining a request is handed: the rules in force, the table (read, never
/// written), and in global mode the fleet and the exact rules' client.
pub(super) struct Explaining<'a> {
    pub compiled: &'a Compiled,
    pub table: &'a EntityTable,
    /// Global mode: what the heartbeats say of the fleet, read once the store answered.
    pub fleet: Option<&'a Fleet>,
    /// Global mode: the exact rules' way to the store, read-only here.
    pub exact: Option<&'a ExactClient>,
    pub opts: &'a Options,
}

/// What `req` (validated) would be answered at `now`, and why; nothing is counted,
/// refunded, created, queued for the sync or recorded in the request metrics.
pub(super) async fn explain(
    at: &Explaining<'_>,
    req: &RateLimitRequest,
    now: UnixMillis,
) -> Explanation {
    let hits = hits_of(req);
    let targets = quiet_targets(at.compiled, req);
    let replaced: Vec<Option<String>> = replaced_by(&targets)
        .into_iter()
        .map(|r| r.map(str::to_string))
        .collect();
    let looked_hits: Vec<u64> = hits
        .iter()
        .zip(&req.descriptors)
        .map(|(&h, d)| if d.is_negative_hits { 0 } else { h })
        .collect();
    // What the request counts on: the targets but those another rule replaces.
    let kept = kept(&targets, &replaced);
    let (mut looks, exact_notes) = exact_looks(at.exact, &kept, &looked_hits, now).await;
    // Read once, after the store call: as the fleet stands when the memory is looked at.
    let fleet = at.fleet.map_or(FleetView::ALONE, Fleet::view);
    for (i, t) in kept.iter().enumerate() {
        if looks[i].is_none() {
            looks[i] = t.rule().and_then(|r| {
                let entity = match t {
                    Target::Rule(_, e, ..) | Target::Override(_, e, _) => *e,
                    Target::NoRule => return None,
                };
                look_in_memory(at.table, &fleet, r, entity, now, looked_hits[i])
            });
        }
    }
    let outcomes: Vec<Option<Outcome>> = looks
        .iter()
        .map(|l| {
            l.as_ref()
                .and_then(|l| pick(l.iter().map(|(_, with)| *with)))
        })
        .collect();
    let overall = overall(at.opts, req, &kept, &outcomes);
    let mut budget = LOCATE_BUDGET_BYTES;
    let found = (targets.iter().zip(hits).zip(replaced))
        .zip(looks.into_iter().zip(outcomes).zip(exact_notes))
        .map(
            |(((target, hits), replaced), ((looks, outcome), exact))| Found {
                target,
                hits,
                replaced,
                looks,
                outcome,
                exact,
            },
        );
    let descriptors = (req.descriptors.iter().zip(found))
        .map(|(d, found)| describe(at.compiled, req, d, found, &mut budget))
        .collect();
    Explanation {
        domain: req.domain.clone(),
        overall_code: code_name(overall),
        shadow_mode: at.opts.shadow_mode,
        charged: false,
        descriptors,
    }
}

/// What was found for one descriptor.
struct Found<'a> {
    target: &'a Target<'a>,
    hits: u64,
    /// The rule that `replaces` its rule in this request.
    replaced: Option<String>,
    looks: Option<Looks>,
    outcome: Option<Outcome>,
    /// Exact rules in global mode: where the counts came from.
    exact: Option<String>,
}

/// One descriptor's explanation: its rule (where it was written, found within `budget`) or
/// why none, its limits and decision.
fn describe(
    compiled: &Compiled,
    req: &RateLimitRequest,
    d: &RateLimitDescriptor,
    found: Found<'_>,
    budget: &mut usize,
) -> DescriptorExplanation {
    let rule = found.target.rule();
    let outcome = found.outcome.filter(|_| found.replaced.is_none());
    let over = outcome.is_some_and(|o| o.over);
    let shadow = rule.is_some_and(|r| r.shadow_mode);
    DescriptorExplanation {
        entries: d
            .entries
            .iter()
            .map(|e| EntryJson {
                key: e.key.clone(),
                value: e.value.clone(),
            })
            .collect(),
        hits: found.hits,
        refund: d.is_negative_hits,
        rule: rule.map(|r| RuleJson {
            name: r.name.clone(),
            full_key: r.full_key.clone(),
            source: source_json(compiled, found.target, req, d, budget),
            override_of: r.override_of.clone(),
            unlimited: r.unlimited,
            shadow_mode: r.shadow_mode,
            quota_mode: r.quota_mode,
            exact: found.exact,
        }),
        no_match: rule.is_none().then(|| no_match(compiled, &req.domain, d)),
        limits: match (rule, &found.looks) {
            (Some(r), Some(l)) if found.replaced.is_none() => limits_json(r, l),
            _ => Vec::new(),
        },
        replaced_by: found.replaced,
        decision: code_name(over),
        code: code_name(over && !shadow),
    }
}

/// Every descriptor's target as `resolve` finds it, but making no metric series: a rule's
/// own stats handle, a throwaway one for a request-supplied limit (the targets go only to
/// `respond.rs`, which reads no stats).
fn quiet_targets<'a>(compiled: &'a Compiled, req: &RateLimitRequest) -> Vec<Target<'a>> {
    req.descriptors
        .iter()
        .map(|d| {
            if let Some(o) = &d.limit {
                if !compiled.rules.has_domain(&req.domain) {
                    return Target::NoRule;
                }
                let (rule, entity) = request_override(&req.domain, d, o);
                return Target::Override(rule, entity, Arc::new(RuleStats::default()));
            }
            match compiled.rules.find(&req.domain, &d.entries) {
                Some(m) => Target::Rule(m.rule, m.entity, compiled.stats[m.index].clone(), None),
                None => Target::NoRule,
            }
        })
        .collect()
}

/// A rule's limits checked on a copy of its entity's states in `table` (what the table's
/// summary keeps of it when it was evicted while counting, as its next request would start
/// from; fresh ones when neither: a first request's view, the prior included in global
/// mode); `None` when unlimited.
fn look_in_memory(
    table: &EntityTable,
    fleet: &FleetView,
    rule: &Rule,
    entity: u128,
    now: UnixMillis,
    hits: u64,
) -> Option<Looks> {
    let limits: Vec<_> = rule.limits.iter().map(|l| l.limit).collect();
    let held = table.peek(entity, &limits, now);
    look_on(rule, held, now, hits, fleet)
}

/// A rule's limits checked on `held` states (an entity's, copied; `None`: fresh ones), as
/// this replica sees the fleet's count (`fleet`): what `/explain` and `/top` report.
pub(super) fn look_on(
    rule: &Rule,
    held: Option<Vec<LimitState>>,
    now: UnixMillis,
    hits: u64,
    fleet: &FleetView,
) -> Option<Looks> {
    if rule.unlimited || rule.limits.is_empty() {
        return None;
    }
    let mut states = held.unwrap_or_else(|| {
        rule.limits
            .iter()
            .map(|s| LimitState::restored(&s.limit, None))
            .collect()
    });
    Some(
        rule.limits
            .iter()
            .zip(states.iter_mut())
            .map(|(spec, state)| {
                let standing = state.clone().check_with(&spec.limit, now, 0, fleet);
                let with = state.check_with(&spec.limit, now, hits, fleet);
                (standing, with)
            })
            .collect(),
    )
}

/// Global mode (with `client`): the exact rules' limits read from the store by one
/// read-only call (the exact script with `commit` off reads and writes nothing), and per
/// descriptor where the counts came from. `None` looks for every other descriptor, and for
/// all of them when the call fails (they are then looked at in memory, and the note says
/// why).
async fn exact_looks(
    client: Option<&ExactClient>,
    targets: &[Target<'_>],
    hits: &[u64],
    now: UnixMillis,
) -> (Vec<Option<Looks>>, Vec<Option<String>>) {
    let n = targets.len();
    let (mut looks, mut notes) = (vec![None; n], vec![None; n]);
    let Some(client) = client else {
        return (looks, notes);
    };
    let Some(plan) = super::exact::plan(targets, hits, |_| false, now) else {
        return (looks, notes);
    };
    match client.check_and_count(&plan.items, false).await {
        Ok(reply) => {
            for ((it, c), &owner) in plan.items.iter().zip(&reply.counts).zip(&plan.owners) {
                let standing = natural(&ExactItem { hits: 0, ..*it }, now, c);
                let with = natural(it, now, c);
                looks[owner]
                    .get_or_insert_with(Vec::new)
                    .push((standing, with));
                notes[owner] = Some("store".to_string());
            }
        }
        Err(e) => {
            for &owner in &plan.owners {
                notes[owner] = Some(format!("memory (the store did not answer: {e})"));
            }
        }
    }
    (looks, notes)
}

/// Whether the overall code would be `OVER_LIMIT`: `respond.rs`'s rules (quota groups, rule
/// and global shadow mode) on the outcomes.
fn overall(
    opts: &Options,
    req: &RateLimitRequest,
    kept: &[Target<'_>],
    outcomes: &[Option<Outcome>],
) -> bool {
    let mut response = respond::Response::with_capacity(kept.len(), opts);
    for (t, o) in kept.iter().zip(outcomes) {
        match (t.rule(), o) {
            (None, _) => response.no_rule(),
            (Some(_), None) => response.unlimited(),
            (Some(rule), Some(o)) => response.limited(rule, o, opts, || t.policy_id()),
        }
    }
    response.finish(req, kept, opts).overall_code == Code::OverLimit as i32
}

/// The targets a request counts on: `targets` but those another rule `replaces`, which
/// count nothing.
fn kept<'a>(targets: &[Target<'a>], replaced: &[Option<String>]) -> Vec<Target<'a>> {
    targets
        .iter()
        .zip(replaced)
        .map(|(t, r)| match (t, r) {
            (Target::Rule(rule, e, s, c), None) => Target::Rule(rule, *e, s.clone(), *c),
            (Target::Override(rule, e, s), None) => Target::Override(rule.clone(), *e, s.clone()),
            _ => Target::NoRule,
        })
        .collect()
}

fn code_name(over: bool) -> &'static str {
    if over {
        "OVER_LIMIT"
    } else {
        "OK"
    }
}

/// Where a target's rule was written.
fn source_json(
    compiled: &Compiled,
    t: &Target<'_>,
    req: &RateLimitRequest,
    d: &RateLimitDescriptor,
    budget: &mut usize,
) -> SourceJson {
    if matches!(t, Target::Override(..)) {
        return SourceJson::Request { request: true };
    }
    let source = compiled
        .rules
        .find(&req.domain, &d.entries)
        .and_then(|m| compiled.rules.source(m.index, budget));
    match source {
        Some(Source::Xds { resource }) => SourceJson::Xds { xds: resource },
        Some(Source::File { file, line }) => SourceJson::File { file, line },
        None => SourceJson::File {
            file: String::new(),
            line: None,
        },
    }
}

/// Why a descriptor matched no rule: the walk's stop (`rules/miss.rs`), a request-supplied
/// limit for a domain without rules, or a rule that matched but was dropped.
fn no_match(compiled: &Compiled, domain: &str, d: &RateLimitDescriptor) -> NoMatchJson {
    use crate::rules::Miss;
    let miss = if d.limit.is_some() {
        Some(Miss::UnknownDomain)
    } else {
        compiled.rules.miss(domain, &d.entries)
    };
    let message = miss.as_ref().map_or_else(String::new, ToString::to_string);
    let (reason, level, key, value) = match miss {
        Some(Miss::NoEntries) | None => ("no_entries", None, None, None),
        Some(Miss::UnknownDomain) => ("unknown_domain", None, None, None),
        Some(Miss::NoKey { level, key }) => ("no_key", Some(level), Some(key), None),
        Some(Miss::NoValue { level, key, value }) => {
            ("no_value", Some(level), Some(key), Some(value))
        }
        Some(Miss::NoLimit { level, key, value }) => {
            ("no_limit", Some(level), Some(key), Some(value))
        }
    };
    NoMatchJson {
        reason,
        level,
        key,
        value,
        message,
    }
}

/// A rule's limits with their looks.
fn limits_json(rule: &Rule, looks: &Looks) -> Vec<LimitJson> {
    rule.limits
        .iter()
        .zip(looks)
        .map(|(spec, (standing, with))| {
            let l = &spec.limit;
            let (algorithm, burst) = match l.algorithm {
                Algorithm::SlidingWindow => ("sliding_window", None),
                Algorithm::FixedWindow => ("fixed_window", None),
                Algorithm::TokenBucket { burst } => ("token_bucket", Some(burst)),
                Algorithm::Concurrency => ("concurrency", None),
            };
            let multiplier = l.window_ms / 1000 / spec.unit.seconds();
            LimitJson {
                algorithm,
                burst,
                requests_per_unit: l.requests_per_unit,
                unit: spec.unit.name(),
                unit_multiplier: (multiplier != 1).then_some(multiplier),
                count: standing.count_after,
                remaining: standing.remaining,
                reset_seconds: standing.reset_ms.div_ceil(1000),
                decision: code_name(with.over),
            }
        })
        .collect()
}
