//! Criterion benchmark of descriptor matching (`RuleSet::find`) as a domain grows from a few
//! rules to 1,000 exact-value or 1,000 wildcard rules: the in-process half of
//! `benches/cpu.sh`, without the gRPC stack's noise. The request values rotate over 1,000
//! (`user=v0`..`v999`), as in `benches/cpu.sh`.
//!
//! `cargo bench --bench rules` (add `-- --quick` for a short run).

use criterion::{criterion_group, criterion_main, Criterion};
use sluice::rules::{compile_sources, RuleSet};

const LIMIT: &str = "    rate_limit: {unit: second, requests_per_unit: 1000000000}\n";

fn set(descriptors: &str) -> RuleSet {
    let text = format!("domain: cpu\ndescriptors:\n{descriptors}");
    compile_sources(&[("cpu.yaml".into(), text)], false).expect("the generated rules compile")
}

fn bench_find(c: &mut Criterion) {
    let few = set(&format!(
        "  - key: user\n{LIMIT}  - key: path\n    value: /api/*\n{LIMIT}  - key: ip\n{LIMIT}"
    ));
    let exact = set(&(0..1000)
        .map(|i| format!("  - key: user\n    value: v{i}\n{LIMIT}"))
        .collect::<String>());
    // Longest prefix first, as in benches/cpu.sh: each value's own pattern is its first match.
    let wildcard = set(&(0..1000)
        .rev()
        .map(|i| format!("  - key: user\n    value: \"v{i}*\"\n{LIMIT}"))
        .collect::<String>());
    let values: Vec<String> = (0..1000).map(|i| format!("v{i}")).collect();
    for (name, rules) in [
        ("few rules", &few),
        ("1k exact", &exact),
        ("1k wildcard", &wildcard),
    ] {
        let mut n = 0;
        c.bench_function(&format!("find: {name}"), |b| {
            b.iter(|| {
                n = (n + 1) % values.len();
                rules
                    .find("cpu", &[("user", values[n].as_str())])
                    .map(|m| m.entity)
            })
        });
    }
}

criterion_group!(benches, bench_find);
criterion_main!(benches);
