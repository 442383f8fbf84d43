//! The xDS resource `ratelimit.config.ratelimit.v3.RateLimitConfig` (one domain) as the rules
//! model the YAML files produce ([`model::RulesFile`]), so that a set pushed over xDS is
//! validated and compiled by the very code that checks files. Every field of the proto has a
//! counterpart in the model (the reference's `config_xds.go` maps the same ones), so nothing
//! is refused here: what the model cannot take, compile reports, in the files' wording.

use envoy_types::pb::google::protobuf::{value::Kind, Any, Struct, Value};
use envoy_types::pb::ratelimit::config::ratelimit::v3 as pb;
use prost::Message as _;
use serde_yaml::{Mapping, Number};

use crate::rules::model::{self, ConfigError};
use crate::rules::{CompileOptions, RuleSet};

/// The resource type sluice subscribes to (the reference's `resource.RateLimitConfigType`).
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Decodes, converts and compiles every resource of one response (state of the world: all
/// of them are the whole rule set) as `options` say, naming each `xds:<name>` in errors and
/// in `/rlconfig`.
///
/// # Errors
/// Every problem of every resource: one that is not a `RateLimitConfig` or does not decode,
/// and every validation error of the converted rules.
pub fn compile_resources(
    resources: &[Any],
    options: CompileOptions,
) -> Result<(RuleSet, Vec<String>), Vec<ConfigError>> {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for (i, any) in resources.iter().enumerate() {
        let fallback = format!("xds:resources[{i}]");
        if any.type_url != TYPE_URL {
            errors.push(ConfigError::new(
                &fallback,
                format!("resource type '{}' is not {TYPE_URL}", any.type_url),
            ));
            continue;
        }
        match pb::RateLimitConfig::decode(any.value.as_slice()) {
            Ok(config) => {
                let name = if config.name.is_empty() {
                    fallback
                } else {
                    format!("xds:{}", config.name)
                };
                files.push((name, rules_file(&config)));
            }
            Err(e) => errors.push(ConfigError::new(
                &fallback,
                format!("cannot decode RateLimitConfig: {e}"),
            )),
        }
    }
    let compiled = RuleSet::compile_with(&files, options);
    let set = crate::rules::with_prior_errors(errors, compiled)?;
    Ok((set, files.into_iter().map(|(name, _)| name).collect()))
}

/// One `RateLimitConfig` as a rules file.
pub fn rules_file(config: &pb::RateLimitConfig) -> model::RulesFile {
    model::RulesFile {
        domain: config.domain.clone(),
        descriptors: config.descriptors.iter().map(descriptor).collect(),
    }
}

fn descriptor(d: &pb::RateLimitDescriptor) -> model::DescriptorConfig {
    model::DescriptorConfig {
        key: d.key.clone(),
        value: d.value.clone(),
        rate_limit: d.rate_limit.as_ref().map(policy),
        descriptors: d.descriptors.iter().map(descriptor).collect(),
        shadow_mode: d.shadow_mode,
        quota_mode: d.quota_mode,
        detailed_metric: d.detailed_metric,
        metadata: d.metadata.as_ref().map(struct_value),
        ..model::DescriptorConfig::default()
    }
}

fn policy(p: &pb::RateLimitPolicy) -> model::RateLimitConfig {
    // The unit as the files spell it. UNKNOWN (the proto's zero, i.e. no unit given) and a
    // number no enum value has stay visible, so compile reports them as invalid units, as the
    // reference does with `Unit.String()`; an unlimited policy without a unit is fine there.
    let unit = match pb::RateLimitUnit::try_from(p.unit) {
        Ok(pb::RateLimitUnit::Unknown) if p.unlimited => String::new(),
        Ok(u) => u.as_str_name().to_ascii_lowercase(),
        Err(_) => p.unit.to_string(),
    };
    model::RateLimitConfig {
        unit,
        // proto3 cannot tell a missing count from 0: the policy says what it says.
        requests_per_unit: Some(p.requests_per_unit),
        unlimited: p.unlimited,
        name: p.name.clone(),
        replaces: p
            .replaces
            .iter()
            .map(|r| model::ReplacesConfig {
                name: r.name.clone(),
            })
            .collect(),
        ..model::RateLimitConfig::default()
    }
}

/// A `google.protobuf.Struct` as the YAML value a file's `metadata` would be.
fn struct_value(s: &Struct) -> serde_yaml::Value {
    // In key order: the proto's map has none, and the same set must convert the same way.
    let mut fields: Vec<_> = s.fields.iter().collect();
    fields.sort_by(|a, b| a.0.cmp(b.0));
    let mut map = Mapping::new();
    for (k, v) in fields {
        map.insert(serde_yaml::Value::String(k.clone()), value(v));
    }
    serde_yaml::Value::Mapping(map)
}

fn value(v: &Value) -> serde_yaml::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_yaml::Value::Null,
        Some(Kind::BoolValue(b)) => serde_yaml::Value::Bool(*b),
        Some(Kind::StringValue(s)) => serde_yaml::Value::String(s.clone()),
        // Struct numbers are doubles; a whole one becomes an integer, as a file's `3` is, so
        // the dynamic metadata and `/rlconfig` read the same whichever way the rules came.
        Some(Kind::NumberValue(n)) => {
            let whole = n.fract() == 0.0 && n.abs() < 9.0e15;
            #[allow(clippy::cast_possible_truncation)]
            let number = if whole {
                Number::from(*n as i64)
            } else {
                Number::from(*n)
            };
            serde_yaml::Value::Number(number)
        }
        Some(Kind::StructValue(s)) => struct_value(s),
        Some(Kind::ListValue(l)) => {
            serde_yaml::Value::Sequence(l.values.iter().map(value).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(config: &pb::RateLimitConfig) -> Any {
        Any {
            type_url: TYPE_URL.into(),
            value: config.encode_to_vec(),
        }
    }

    fn limit(unit: pb::RateLimitUnit, n: u32) -> Option<pb::RateLimitPolicy> {
        Some(pb::RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: n,
            ..Default::default()
        })
    }

    #[test]
    fn every_field_maps_to_the_model() {
        let config = pb::RateLimitConfig {
            name: "n".into(),
            domain: "d".into(),
            descriptors: vec![pb::RateLimitDescriptor {
                key: "k".into(),
                value: "v".into(),
                rate_limit: Some(pb::RateLimitPolicy {
                    unit: pb::RateLimitUnit::Week as i32,
                    requests_per_unit: 7,
                    unlimited: false,
                    name: "weekly".into(),
                    replaces: vec![pb::RateLimitReplace {
                        name: "other".into(),
                    }],
                }),
                descriptors: vec![pb::RateLimitDescriptor {
                    key: "inner".into(),
                    rate_limit: Some(pb::RateLimitPolicy {
                        unlimited: true,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                shadow_mode: true,
                detailed_metric: true,
                quota_mode: true,
                metadata: Some(Struct {
                    fields: [
                        (
                            "team".to_string(),
                            Value {
                                kind: Some(Kind::StringValue("a".into())),
                            },
                        ),
                        (
                            "n".to_string(),
                            Value {
                                kind: Some(Kind::NumberValue(3.0)),
                            },
                        ),
                    ]
                    .into(),
                }),
            }],
        };
        let f = rules_file(&config);
        assert_eq!(f.domain, "d");
        let d = &f.descriptors[0];
        assert_eq!((d.key.as_str(), d.value.as_str()), ("k", "v"));
        assert!(d.shadow_mode && d.detailed_metric && d.quota_mode);
        let rl = d.rate_limit.as_ref().unwrap();
        assert_eq!((rl.unit.as_str(), rl.requests_per_unit), ("week", Some(7)));
        assert_eq!(
            (rl.name.as_str(), rl.replaces[0].name.as_str()),
            ("weekly", "other")
        );
        let inner = d.descriptors[0].rate_limit.as_ref().unwrap();
        assert!(inner.unlimited && inner.unit.is_empty());
        let meta = serde_yaml::to_string(d.metadata.as_ref().unwrap()).unwrap();
        assert_eq!(meta, "n: 3\nteam: a\n");
        let (set, names) = compile_resources(&[any(&config)], CompileOptions::default()).unwrap();
        assert_eq!(names, ["xds:n"]);
        assert_eq!(set.rules().len(), 2);
    }

    #[test]
    fn problems_are_reported_per_resource() {
        let bad_unit = pb::RateLimitConfig {
            name: "a".into(),
            domain: "d".into(),
            descriptors: vec![pb::RateLimitDescriptor {
                key: "k".into(),
                rate_limit: limit(pb::RateLimitUnit::Unknown, 1),
                ..Default::default()
            }],
        };
        let dup = pb::RateLimitConfig {
            name: "b".into(),
            domain: "d".into(),
            descriptors: vec![],
        };
        let garbage = Any {
            type_url: TYPE_URL.into(),
            value: vec![0xff, 0xff],
        };
        let other = Any {
            type_url: "type.googleapis.com/other".into(),
            value: vec![],
        };
        let errs = compile_resources(
            &[any(&bad_unit), any(&dup), garbage, other],
            CompileOptions::default(),
        )
        .unwrap_err();
        let msgs: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert!(
            msgs.iter()
                .any(|m| m.starts_with("xds:resources[2]: cannot decode")),
            "{msgs:?}"
        );
        assert!(
            msgs.iter()
                .any(|m| m
                    .starts_with("xds:resources[3]: resource type 'type.googleapis.com/other'")),
            "{msgs:?}"
        );
        // No text, so no line: the domain and descriptor path say where.
        assert!(
            msgs.contains(&"xds:a: invalid rate limit unit 'unknown' (valid: second, minute, hour, day, week, month, year) (domain 'd', descriptor path 'k')".to_string()),
            "{msgs:?}"
        );
        assert!(
            msgs.contains(&"xds:b: duplicate domain 'd' in config file (domain 'd')".to_string()),
            "{msgs:?}"
        );
        // Merged, the duplicate domain is fine.
        let ok = pb::RateLimitConfig {
            descriptors: vec![pb::RateLimitDescriptor {
                key: "j".into(),
                rate_limit: limit(pb::RateLimitUnit::Second, 1),
                ..Default::default()
            }],
            ..bad_unit
        };
        compile_resources(
            &[any(&ok), any(&dup)],
            CompileOptions {
                merge_domains: true,
                ..CompileOptions::default()
            },
        )
        .unwrap();
    }

    #[test]
    fn no_resources_is_an_empty_set() {
        let (set, names) = compile_resources(&[], CompileOptions::default()).unwrap();
        assert!(set.rules().is_empty() && names.is_empty());
    }
}
