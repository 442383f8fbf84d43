//! `RESPONSE_RULE_METADATA`: the rules behind a decision, as a `sluice` struct in the
//! response's dynamic metadata, so that Envoy's access log can name the rule that denied a
//! request, or the one in shadow mode that would have (docs/operations.md, "Which rule denied
//! a request").

use std::borrow::Cow;
use std::collections::HashMap;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::google::protobuf::{Struct, Value};

use super::metadata::{string, structure};
use super::resolve::Target;

/// The field of the dynamic metadata that holds the struct: Envoy's access log reads it as
/// `%DYNAMIC_METADATA(envoy.filters.http.ratelimit:sluice:denied_by)%`. The reference's shape
/// (`RESPONSE_DYNAMIC_METADATA`) has no field of that name, so both can be on.
pub(super) const FIELD: &str = "sluice";

/// What a response decided, as far as the rules behind it go.
pub(super) struct Denials<'s> {
    /// The statuses, in request order.
    pub(super) statuses: &'s [DescriptorStatus],
    /// The descriptors whose rule is in shadow mode and was over (reported OK), in order.
    pub(super) shadow_over: &'s [usize],
    /// The request is refused (overall `OVER_LIMIT`).
    pub(super) refused: bool,
    /// The request would have been refused but global `SHADOW_MODE` said OK.
    pub(super) shadowed: bool,
}

impl Denials<'_> {
    /// The `sluice` struct, or `None` when no rule denied the request or would have (then the
    /// response's dynamic metadata stays the reference's, absent when that is off):
    /// - `denied_by`: the rules of the descriptors over their limits in a refused request;
    /// - `shadow_denied_by`: the rules in shadow mode that were over, and, when global
    ///   `SHADOW_MODE` let an over request through, the rules that were over.
    ///
    /// Each is a comma-joined string, as Envoy's access log prints a string bare (a list would
    /// print as JSON): each rule once, in request order, by its `name` when it has one, else
    /// its path (the ids of `RateLimit-Policy` and the problem body). `denied_by_path` and
    /// `shadow_denied_by_path` name the same rules by path alone, as metrics' `rule` label does.
    /// A quota descriptor over in a request that passed (another model had quota) denied
    /// nothing and is in neither.
    pub(super) fn metadata(&self, targets: &[Target<'_>]) -> Option<Value> {
        let over: Vec<usize> = (0..self.statuses.len())
            .filter(|&i| self.statuses[i].code == Code::OverLimit as i32)
            .collect();
        let (denied, mut shadow) = if self.refused {
            (over, Vec::new())
        } else if self.shadowed {
            (Vec::new(), over)
        } else {
            (Vec::new(), Vec::new())
        };
        shadow.extend_from_slice(self.shadow_over);
        shadow.sort_unstable();
        let mut fields = HashMap::new();
        put(&mut fields, "denied_by", &denied, targets);
        put(&mut fields, "shadow_denied_by", &shadow, targets);
        (!fields.is_empty()).then(|| structure(Struct { fields }))
    }
}

/// Adds `name` and `<name>_path` naming the rules of the descriptors `at`, when there are any.
fn put(fields: &mut HashMap<String, Value>, name: &str, at: &[usize], targets: &[Target<'_>]) {
    let mut ids: Vec<Cow<'_, str>> = Vec::new();
    let mut paths: Vec<Cow<'_, str>> = Vec::new();
    for &i in at {
        let Some(t) = targets.get(i) else { continue };
        let (id, path) = (t.policy_id(), path(t));
        // Two descriptors of one rule (two users over, say) name it once.
        let seen = ids.iter().zip(&paths).any(|(i, p)| *i == id && *p == path);
        if !id.is_empty() && !seen {
            ids.push(id);
            paths.push(path);
        }
    }
    if ids.is_empty() {
        return;
    }
    fields.insert(name.to_string(), string(&ids.join(",")));
    fields.insert(format!("{name}_path"), string(&paths.join(",")));
}

/// A target's rule path, as metrics name it; a request's limit override is
/// `<domain>.override`, as its series is, since its own path holds the request's values.
fn path<'t>(t: &'t Target<'_>) -> Cow<'t, str> {
    match t {
        Target::Rule(r, ..) => Cow::Borrowed(&r.full_key),
        Target::Override(r, ..) => Cow::Owned(format!("{}.override", r.domain)),
        Target::NoRule => Cow::Borrowed(""),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
    use envoy_types::pb::google::protobuf::value::Kind;

    use super::*;
    use crate::core::clock::{ManualClock, UnixMillis};
    use crate::rls::{Options, RateLimiter};

    const T0: UnixMillis = UnixMillis(1_700_006_400_000);

    /// One hit a minute each: the second request of a descriptor is over.
    const RULES: &str = r#"
domain: d
descriptors:
  - key: user
    metadata: {team: a}
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 1}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: trial
    shadow_mode: true
    rate_limit: {name: trial-limit, unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
"#;

    fn limiter(opts: Options) -> Arc<RateLimiter> {
        RateLimiter::local(RULES, Arc::new(ManualClock::new(T0)), opts).unwrap()
    }

    fn on() -> Options {
        Options {
            rule_metadata: true,
            ..Options::default()
        }
    }

    fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        }
    }

    fn ask_with(l: &RateLimiter, descriptors: Vec<RateLimitDescriptor>) -> RateLimitResponse {
        let req = RateLimitRequest {
            domain: "d".into(),
            descriptors,
            hits_addend: 0,
        };
        l.should_rate_limit(&req).unwrap()
    }

    fn ask(l: &RateLimiter, descriptors: &[(&str, &str)]) -> RateLimitResponse {
        ask_with(
            l,
            descriptors.iter().map(|(k, v)| descriptor(k, v)).collect(),
        )
    }

    /// The `sluice` struct's string fields, sorted by name.
    fn sluice(r: &RateLimitResponse) -> Vec<(String, String)> {
        let Some(meta) = &r.dynamic_metadata else {
            return Vec::new();
        };
        let Some(Kind::StructValue(s)) = meta.fields.get(FIELD).and_then(|v| v.kind.clone()) else {
            return Vec::new();
        };
        let mut out: Vec<(String, String)> = s
            .fields
            .into_iter()
            .map(|(k, v)| match v.kind {
                Some(Kind::StringValue(text)) => (k, text),
                other => panic!("{k} is not a string: {other:?}"),
            })
            .collect();
        out.sort();
        out
    }

    fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_refused_request_names_the_rules_over_by_name_and_by_path() {
        let l = limiter(on());
        let first = ask(&l, &[("user", "a"), ("path", "/x"), ("free", "f")]);
        assert_eq!(first.dynamic_metadata, None, "nothing denied: no metadata");
        // Both over; a second user of the same rule names it once; the unlimited and the
        // unknown descriptors are not rules that denied.
        ask(&l, &[("user", "b")]);
        let r = ask(
            &l,
            &[
                ("user", "a"),
                ("free", "f"),
                ("path", "/x"),
                ("user", "b"),
                ("nope", "n"),
            ],
        );
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert_eq!(
            sluice(&r),
            fields(&[
                ("denied_by", "per-user,d.path"),
                ("denied_by_path", "d.user,d.path"),
            ])
        );
        // Only the sluice field: RESPONSE_DYNAMIC_METADATA is off.
        let keys: Vec<&String> = r.dynamic_metadata.as_ref().unwrap().fields.keys().collect();
        assert_eq!(keys, [FIELD]);
    }

    #[test]
    fn a_shadow_rule_over_is_named_apart_whether_or_not_another_rule_denied() {
        let l = limiter(on());
        ask(&l, &[("trial", "t"), ("user", "a")]);
        // The shadow rule alone: the request passes, and its rule would have denied it.
        let r = ask(&l, &[("trial", "t")]);
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(
            sluice(&r),
            fields(&[
                ("shadow_denied_by", "trial-limit"),
                ("shadow_denied_by_path", "d.trial"),
            ])
        );
        // With a rule that denies: each in its own field.
        let r = ask(&l, &[("trial", "t"), ("user", "a")]);
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert_eq!(
            sluice(&r),
            fields(&[
                ("denied_by", "per-user"),
                ("denied_by_path", "d.user"),
                ("shadow_denied_by", "trial-limit"),
                ("shadow_denied_by_path", "d.trial"),
            ])
        );
    }

    #[test]
    fn global_shadow_mode_names_the_rules_that_would_have_denied() {
        let l = limiter(Options {
            shadow_mode: true,
            ..on()
        });
        ask(&l, &[("path", "/x")]);
        let r = ask(&l, &[("path", "/x"), ("user", "a")]);
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(
            sluice(&r),
            fields(&[
                ("shadow_denied_by", "d.path"),
                ("shadow_denied_by_path", "d.path"),
            ])
        );
    }

    #[test]
    fn off_by_default_the_response_stays_the_references() {
        let l = limiter(Options::default());
        ask(&l, &[("user", "a"), ("trial", "t")]);
        let r = ask(&l, &[("user", "a"), ("trial", "t")]);
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert_eq!(r.dynamic_metadata, None);
        // RESPONSE_DYNAMIC_METADATA alone: the reference's fields, no sluice field.
        let l = limiter(Options {
            dynamic_metadata: true,
            ..Options::default()
        });
        ask(&l, &[("user", "a")]);
        let r = ask(&l, &[("user", "a")]);
        let meta = r.dynamic_metadata.expect("the reference's metadata");
        assert!(meta.fields.contains_key("domain"), "{meta:?}");
        assert!(!meta.fields.contains_key(FIELD), "{meta:?}");
    }

    #[test]
    fn with_the_references_metadata_both_are_there() {
        let l = limiter(Options {
            dynamic_metadata: true,
            ..on()
        });
        // Within the limit: the reference's fields (the passed rule's metadata), no sluice.
        let r = ask(&l, &[("user", "a")]);
        let meta = r.dynamic_metadata.as_ref().expect("metadata");
        assert!(meta.fields.contains_key("metadata"), "{meta:?}");
        assert!(!meta.fields.contains_key(FIELD), "{meta:?}");
        // Over: the reference's fields and the sluice field side by side.
        let r = ask(&l, &[("user", "a")]);
        let meta = r.dynamic_metadata.as_ref().expect("metadata");
        assert_eq!(
            meta.fields.get("domain").and_then(|v| v.kind.clone()),
            Some(Kind::StringValue("d".into()))
        );
        assert!(meta.fields.contains_key("descriptors"), "{meta:?}");
        assert_eq!(
            sluice(&r),
            fields(&[("denied_by", "per-user"), ("denied_by_path", "d.user")])
        );
    }

    #[test]
    fn a_quota_over_in_a_request_that_passed_denied_nothing() {
        let l = limiter(Options {
            quota_mode: true,
            ..on()
        });
        // Each descriptor its own quota group: one out of quota, the other not, passes.
        ask(&l, &[("path", "/x")]);
        let r = ask(&l, &[("path", "/x"), ("user", "a")]);
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
        assert_eq!(r.dynamic_metadata, None);
        // Every group out of quota: refused, by both.
        let r = ask(&l, &[("path", "/x"), ("user", "a")]);
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert_eq!(
            sluice(&r),
            fields(&[
                ("denied_by", "d.path,per-user"),
                ("denied_by_path", "d.path,d.user"),
            ])
        );
    }

    #[test]
    fn a_limit_override_is_named_by_its_domain_not_the_requests_values() {
        let l = limiter(on());
        let with_limit = || {
            let mut d = descriptor("user", "secret-id");
            d.limit = Some(RateLimitOverride {
                requests_per_unit: 1,
                unit: Unit::Hour as i32,
            });
            vec![d]
        };
        ask_with(&l, with_limit());
        let r = ask_with(&l, with_limit());
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert_eq!(
            sluice(&r),
            fields(&[
                ("denied_by", "d.override"),
                ("denied_by_path", "d.override")
            ])
        );
    }
}
