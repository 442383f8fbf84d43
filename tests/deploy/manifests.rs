//! The rendered manifests and the accessors the tests read them with: dotted paths into
//! YAML, label selection, the sluice container's env and the settings it resolves to, the
//! rules ConfigMap's files.

use std::collections::BTreeMap;

use serde_yaml::Value;

use crate::RELEASE;

/// The objects `helm template` produced, each with its text as rendered.
pub struct Manifests {
    pub text: String,
    pub objects: Vec<Value>,
    /// The rendered text of each object, in `objects` order: what is validated, rather
    /// than a re-serialization (YAML 1.1 and 1.2 tools disagree on some scalars).
    pub sources: Vec<String>,
}

impl Manifests {
    pub fn parse(text: &str) -> Self {
        let (mut objects, mut sources) = (Vec::new(), Vec::new());
        // Documents are split at `---` lines; block scalars are indented, so a `---` at
        // the start of a line always separates documents.
        let mut docs = vec![String::new()];
        for line in text.lines() {
            if line.trim_end() == "---" {
                docs.push(String::new());
            } else {
                let doc = docs.last_mut().unwrap();
                doc.push_str(line);
                doc.push('\n');
            }
        }
        for doc in docs {
            let value: Value = serde_yaml::from_str(&doc)
                .unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{doc}"));
            if !value.is_null() {
                objects.push(value);
                sources.push(doc);
            }
        }
        assert!(!objects.is_empty(), "helm template rendered nothing");
        Manifests {
            text: text.to_owned(),
            objects,
            sources,
        }
    }

    pub fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|o| str_at(o, "kind") == kind)
            .collect()
    }

    pub fn has_kind(&self, kind: &str) -> bool {
        !self.of_kind(kind).is_empty()
    }

    /// The one object of `kind` named `name`.
    pub fn get(&self, kind: &str, name: &str) -> &Value {
        self.objects
            .iter()
            .find(|o| str_at(o, "kind") == kind && str_at(o, "metadata.name") == name)
            .unwrap_or_else(|| {
                let have: Vec<String> = self
                    .objects
                    .iter()
                    .map(|o| format!("{}/{}", str_at(o, "kind"), str_at(o, "metadata.name")))
                    .collect();
                panic!("no {kind} named {name:?} rendered; have {have:?}")
            })
    }

    /// The only object of `kind`.
    pub fn one(&self, kind: &str) -> &Value {
        let all = self.of_kind(kind);
        assert_eq!(
            all.len(),
            1,
            "expected exactly one {kind}, found {}",
            all.len()
        );
        all[0]
    }

    pub fn deployment(&self) -> &Value {
        self.get("Deployment", RELEASE)
    }
}

/// The value at a dotted path (`a.b.0.c`: numbers index sequences); panics naming the
/// path when something is missing.
pub fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    let mut cur = v;
    for part in path.split('.') {
        let next = match cur {
            Value::Sequence(seq) => part.parse::<usize>().ok().and_then(|i| seq.get(i)),
            Value::Mapping(map) => map.get(part),
            _ => None,
        };
        cur = next.unwrap_or_else(|| panic!("missing `{path}` (at `{part}`) in:\n{}", yaml(v)));
    }
    cur
}

pub fn opt_at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    for part in path.split('.') {
        cur = match cur {
            Value::Sequence(seq) => seq.get(part.parse::<usize>().ok()?)?,
            Value::Mapping(map) => map.get(part)?,
            _ => return None,
        };
    }
    Some(cur)
}

pub fn str_at<'a>(v: &'a Value, path: &str) -> &'a str {
    at(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("`{path}` is not a string in:\n{}", yaml(v)))
}

pub fn i64_at(v: &Value, path: &str) -> i64 {
    at(v, path)
        .as_i64()
        .unwrap_or_else(|| panic!("`{path}` is not an integer in:\n{}", yaml(v)))
}

pub fn seq_at<'a>(v: &'a Value, path: &str) -> &'a Vec<Value> {
    at(v, path)
        .as_sequence()
        .unwrap_or_else(|| panic!("`{path}` is not a list in:\n{}", yaml(v)))
}

pub fn yaml(v: &Value) -> String {
    serde_yaml::to_string(v).unwrap_or_default()
}

/// A string map (labels, selectors) as a BTreeMap.
pub fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .unwrap_or_else(|| panic!("not a map: {}", yaml(v)))
        .iter()
        .map(|(k, v)| {
            let k = k.as_str().expect("string key").to_owned();
            let v = match v {
                Value::String(s) => s.clone(),
                other => yaml(other).trim().to_owned(),
            };
            (k, v)
        })
        .collect()
}

/// True when every `selector` label is on `labels` with the same value.
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The sluice container of the Deployment.
pub fn sluice_container(deploy: &Value) -> &Value {
    seq_at(deploy, "spec.template.spec.containers")
        .iter()
        .find(|c| str_at(c, "name") == "sluice")
        .expect("a container named sluice")
}

/// The container's env entry `name`, if any.
pub fn env_var<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    opt_at(container, "env")?
        .as_sequence()?
        .iter()
        .find(|e| str_at(e, "name") == name)
}

pub fn env_value<'a>(container: &'a Value, name: &str) -> &'a str {
    let var = env_var(container, name).unwrap_or_else(|| panic!("env {name} is not set"));
    str_at(var, "value")
}

/// The settings sluice resolves from the container's plain `value` variables (those from
/// Secrets and field refs are the cluster's, and so is `ADMIN_TOKEN_FILE`, a mounted
/// Secret's file, read at start), with `drop` left out and `extra` added.
pub fn resolve_env(
    container: &Value,
    drop: impl Fn(&str) -> bool,
    extra: &[(&str, &str)],
) -> sluice::settings::Settings {
    let env: std::collections::HashMap<String, String> = seq_at(container, "env")
        .iter()
        .filter_map(|e| {
            Some((
                str_at(e, "name").to_string(),
                opt_at(e, "value")?.as_str()?.to_string(),
            ))
        })
        .filter(|(k, _)| !drop(k) && k != "ADMIN_TOKEN_FILE")
        .chain(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();
    sluice::settings::Settings::resolve(&sluice::settings::ServeArgs::default(), &env)
        .unwrap_or_else(|e| panic!("the rendered env does not resolve: {e:?}"))
}

/// Seconds of a humantime duration as the chart writes it ("20s").
pub fn seconds(humantime: &str) -> i64 {
    humantime
        .strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("SHUTDOWN_GRACE {humantime:?} is not whole seconds like 20s"))
}

/// The rules files of the rendered rules ConfigMap.
pub fn rendered_rules(m: &Manifests) -> BTreeMap<String, String> {
    let cm = m.get("ConfigMap", &format!("{RELEASE}-rules"));
    let files = string_map(at(cm, "data"));
    assert!(!files.is_empty(), "the rules ConfigMap has no files");
    for name in files.keys() {
        assert!(
            name.ends_with(".yaml"),
            "rules file {name} does not end in .yaml"
        );
    }
    files
}
