//! Criterion benchmark of descriptor matching (`RuleSet::find`) as a domain grows from a few
//! rules to 1,000 exact-value or 1,000 wildcard rules: the in-process half of
//! `benches/cpu.sh`, without the gRPC stack's noise. The request values rotate over 1,000
//! (`user=v0`..`v999`), as in `benches/cpu.sh`.
//!
//! `find: 10k host wildcards, 4 KB value` is issue 19's hostile shape: 10,000 patterns
//! `*.t<i>.example.com` (none with a literal prefix) and request values of 4 KB, one
//! descriptor per iteration (a request may carry 64).
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

fn bench_hosts(c: &mut Criterion) {
    let hosts = set(&(0..10_000)
        .map(|i| format!("  - key: host\n    value: \"*.t{i}.example.com\"\n{LIMIT}"))
        .collect::<String>());
    // 4 KB each: one that matches the last pattern, one a middle one, one none.
    let values: Vec<String> = [".t9999.example.com", ".t5000.example.com", ".example.org"]
        .iter()
        .map(|tail| "a.".repeat(2048)[..4096 - tail.len()].to_string() + tail)
        .collect();
    let mut group = c.benchmark_group("find");
    // Ten samples: before the index, one iteration took tens of milliseconds.
    group.sample_size(10);
    let mut n = 0;
    group.bench_function("10k host wildcards, 4 KB value", |b| {
        b.iter(|| {
            n = (n + 1) % values.len();
            hosts
                .find("cpu", &[("host", values[n].as_str())])
                .map(|m| m.entity)
        })
    });
    group.finish();
}

criterion_group!(benches, bench_find, bench_hosts);
criterion_main!(benches);
