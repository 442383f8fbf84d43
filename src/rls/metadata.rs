//! The response's dynamic metadata (`RESPONSE_DYNAMIC_METADATA`, the reference's shape), and
//! the quota groups that decide, for Envoy AI Gateway, which quota descriptors passed and
//! whether a quota request is refused (`respond.rs` takes its overall code from them).

use std::collections::HashMap;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code, DescriptorStatus,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

use super::resolve::Target;
use super::Options;

/// `RESPONSE_DYNAMIC_METADATA`: the reference's shape. `domain`; `descriptors`, one struct per
/// request descriptor (`entries` as `key=value` strings, `limit` for an override, and its
/// own `hitsAddend` when set); the request's `hitsAddend` when not 0; `metadata`, the deep
/// merge of the rule `metadata` of the descriptors that passed (the first descriptor's value
/// wins where two disagree, as in the reference); and, when there are quota descriptors,
/// `passedBackends`: the `backend_name`/`model_name_override` pairs of the descriptors that
/// passed, each once, which Envoy AI Gateway routes by. A descriptor passed when it is within
/// its limit, not unlimited, and not a quota descriptor of a group out of quota
/// ([`QuotaGroups`]).
pub(super) fn dynamic_metadata(
    req: &RateLimitRequest,
    targets: &[Target<'_>],
    statuses: &[DescriptorStatus],
    groups: &QuotaGroups<'_>,
) -> Struct {
    let mut fields = HashMap::new();
    fields.insert("domain".to_string(), string(&req.domain));
    let descriptors = req
        .descriptors
        .iter()
        .map(|d| {
            let mut f = HashMap::new();
            let entries = d
                .entries
                .iter()
                .map(|e| string(&format!("{}={}", e.key, e.value)));
            f.insert("entries".to_string(), list(entries.collect()));
            if let Some(l) = &d.limit {
                let unit = PbUnit::try_from(l.unit).unwrap_or(PbUnit::Unknown);
                let text = format!(
                    "requests_per_unit:{} unit:{}",
                    l.requests_per_unit,
                    unit.as_str_name()
                );
                f.insert("limit".to_string(), string(&text));
            }
            if let Some(h) = &d.hits_addend {
                f.insert("hitsAddend".to_string(), number(h.value as f64));
            }
            structure(Struct { fields: f })
        })
        .collect();
    fields.insert("descriptors".to_string(), list(descriptors));
    if req.hits_addend != 0 {
        fields.insert("hitsAddend".to_string(), number(f64::from(req.hits_addend)));
    }
    // A descriptor no rule applies to passes too, as in the reference (it has no metadata,
    // but may name a backend); unlimited ones do not.
    let passed: Vec<usize> = (0..statuses.len())
        .filter(|&i| {
            statuses[i].code == Code::Ok as i32
                && !targets[i].rule().is_some_and(|r| r.unlimited)
                && !groups.exhausted(i)
        })
        .collect();
    let mut merged = Struct::default();
    for &i in &passed {
        if let Some(meta) = targets[i].rule().and_then(|r| r.metadata.as_deref()) {
            if let Kind::StructValue(src) = yaml_value(meta).kind.unwrap_or(Kind::NullValue(0)) {
                merge(&mut merged, src);
            }
        }
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_string(), structure(merged));
    }
    if groups.any() {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for &i in &passed {
            let pair = model_of(&req.descriptors[i]);
            if pair != ("", "") && !pairs.contains(&pair) {
                pairs.push(pair);
            }
        }
        if !pairs.is_empty() {
            let backends = pairs
                .into_iter()
                .map(|(backend, model)| {
                    structure(Struct {
                        fields: HashMap::from([
                            (BACKEND_NAME.to_string(), string(backend)),
                            (MODEL_NAME_OVERRIDE.to_string(), string(model)),
                        ]),
                    })
                })
                .collect();
            fields.insert("passedBackends".to_string(), list(backends));
        }
    }
    Struct { fields }
}

/// The descriptor entry keys that name a quota's model, as Envoy AI Gateway sends them.
const BACKEND_NAME: &str = "backend_name";
const MODEL_NAME_OVERRIDE: &str = "model_name_override";

/// The `backend_name` and `model_name_override` a descriptor names: the last entry of each,
/// as the reference reads them; "" when it has none.
fn model_of(d: &RateLimitDescriptor) -> (&str, &str) {
    let last = |key: &str| {
        d.entries
            .iter()
            .rev()
            .find(|e| e.key == key)
            .map_or("", |e| e.value.as_str())
    };
    (last(BACKEND_NAME), last(MODEL_NAME_OVERRIDE))
}

/// The quota groups of a request, as envoyproxy/ratelimit makes them for Envoy AI Gateway
/// (its pull request 1243): quota descriptors naming the same `backend_name` and
/// `model_name_override` are one model's buckets (a tenant's and the model's default, say),
/// and the model is out of quota when any of them is over; a quota descriptor naming neither
/// is grouped by its entries. The request is refused when every group is out of quota: AI
/// Gateway then has no model to fall back to.
pub(super) struct QuotaGroups<'r> {
    /// Each group, and whether a descriptor of it is over.
    groups: Vec<(Group<'r>, bool)>,
    /// Per descriptor: its group, for a quota descriptor (empty when there is none).
    of: Vec<Option<usize>>,
}

#[derive(PartialEq)]
enum Group<'r> {
    Model(&'r str, &'r str),
    Entries(&'r [Entry]),
}

impl<'r> QuotaGroups<'r> {
    /// The groups of the limited quota descriptors (`quota_mode`, or `QUOTA_MODE`).
    pub(super) fn of(
        req: &'r RateLimitRequest,
        targets: &[Target<'_>],
        statuses: &[DescriptorStatus],
        opts: &Options,
    ) -> Self {
        let mut g = QuotaGroups {
            groups: Vec::new(),
            of: Vec::new(),
        };
        for (i, (t, s)) in targets.iter().zip(statuses).enumerate() {
            let quota = t
                .rule()
                .is_some_and(|r| !r.unlimited && (r.quota_mode || opts.quota_mode));
            if !quota {
                continue;
            }
            if g.of.is_empty() {
                g.of = vec![None; targets.len()];
            }
            let d = &req.descriptors[i];
            let key = match model_of(d) {
                ("", "") => Group::Entries(&d.entries),
                (backend, model) => Group::Model(backend, model),
            };
            let at = g
                .groups
                .iter()
                .position(|(k, _)| *k == key)
                .unwrap_or_else(|| {
                    g.groups.push((key, false));
                    g.groups.len() - 1
                });
            g.groups[at].1 |= s.code == Code::OverLimit as i32;
            g.of[i] = Some(at);
        }
        g
    }

    /// Whether the request has quota descriptors.
    fn any(&self) -> bool {
        !self.groups.is_empty()
    }

    /// Whether there are quota groups and each is out of quota.
    pub(super) fn all_over(&self) -> bool {
        self.any() && self.groups.iter().all(|(_, over)| *over)
    }

    /// Whether descriptor `i` is a quota descriptor of a group out of quota.
    fn exhausted(&self, i: usize) -> bool {
        self.of
            .get(i)
            .copied()
            .flatten()
            .is_some_and(|at| self.groups[at].1)
    }
}

/// Adds `src`'s fields to `dest`: structs on both sides merge, anything else already there
/// stays.
fn merge(dest: &mut Struct, src: Struct) {
    for (k, v) in src.fields {
        match (dest.fields.get_mut(&k), v.kind) {
            (
                Some(Value {
                    kind: Some(Kind::StructValue(d)),
                }),
                Some(Kind::StructValue(s)),
            ) => merge(d, s),
            (Some(_), _) => {}
            (None, kind) => {
                dest.fields.insert(k, Value { kind });
            }
        }
    }
}

/// A rules-file value as a protobuf value: mappings become structs (keys as text), numbers
/// doubles, tags are dropped.
fn yaml_value(v: &serde_yaml::Value) -> Value {
    use serde_yaml::Value as Y;
    match v {
        Y::Null => Value {
            kind: Some(Kind::NullValue(0)),
        },
        Y::Bool(b) => Value {
            kind: Some(Kind::BoolValue(*b)),
        },
        Y::Number(n) => number(n.as_f64().unwrap_or(0.0)),
        Y::String(s) => string(s),
        Y::Sequence(items) => list(items.iter().map(yaml_value).collect()),
        Y::Mapping(m) => structure(Struct {
            fields: m
                .iter()
                .map(|(k, v)| {
                    let key = match k {
                        Y::String(s) => s.clone(),
                        other => serde_yaml::to_string(other)
                            .unwrap_or_default()
                            .trim_end()
                            .to_string(),
                    };
                    (key, yaml_value(v))
                })
                .collect(),
        }),
        Y::Tagged(t) => yaml_value(&t.value),
    }
}

pub(super) fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

pub(super) fn structure(s: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(s)),
    }
}
