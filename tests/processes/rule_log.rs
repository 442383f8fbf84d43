//! `RESPONSE_RULE_METADATA` through a real Envoy 1.40 (config/envoy/rule-log.yaml, its rules
//! config/rules/rule-log.yaml): the shipped access-log format names the rule that denied a
//! 429 (`denied_by=per-tenant`) and the shadow-mode rule that would have denied a 200
//! (`shadow_denied_by=trial-plan`); a request no rule denied logs `-` for both. The format
//! docs/operations.md shows is the bootstrap's.

use crate::common::{http, repo, wait_until};
use crate::envoy_e2e::Stack;

#[test]
fn envoys_access_log_names_the_rule_that_denied_and_the_shadow_rule_that_would_have() {
    let stack = Stack::start("rule-log.yaml", &[("RESPONSE_RULE_METADATA", "true")]);
    let get = |path: &str, headers: &[(&str, &str)]| {
        http(stack.front, "GET", path, "", headers)
            .expect("request through envoy")
            .0
    };
    // per-tenant: 2 a day; trial-plan: 1 a day, in shadow mode.
    let tenant = [("x-tenant", "acme")];
    let trial = [("x-trial", "t1")];
    assert_eq!(get("/tenant/1", &tenant), 200);
    assert_eq!(get("/tenant/2", &tenant), 200);
    assert_eq!(get("/tenant/3", &tenant), 429, "the 3rd is over per-tenant");
    assert_eq!(get("/trial/1", &trial), 200);
    assert_eq!(
        get("/trial/2", &trial),
        200,
        "a shadow-mode rule never denies"
    );
    let both = [("x-tenant", "acme"), ("x-trial", "t1")];
    assert_eq!(get("/both", &both), 429);

    // Envoy writes its access log every second or so: look until every line is there.
    let want = [
        "GET /tenant/1 200 denied_by=- shadow_denied_by=-",
        "GET /tenant/2 200 denied_by=- shadow_denied_by=-",
        "GET /tenant/3 429 denied_by=per-tenant shadow_denied_by=-",
        "GET /trial/1 200 denied_by=- shadow_denied_by=-",
        "GET /trial/2 200 denied_by=- shadow_denied_by=trial-plan",
        "GET /both 429 denied_by=per-tenant shadow_denied_by=trial-plan",
    ];
    let mut log = String::new();
    wait_until(20, "the six access-log lines", || {
        log = std::fs::read_to_string(&stack.access_log).unwrap_or_default();
        log.lines().count() >= want.len()
    });
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines, want, "Envoy's access log:\n{log}");
}

#[test]
fn the_access_log_format_in_the_docs_is_the_bootstraps() {
    let read = |path: &str| std::fs::read_to_string(repo().join(path)).unwrap();
    let bootstrap = read("config/envoy/rule-log.yaml");
    let format = bootstrap
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("inline_string:"))
        .expect("the bootstrap's access-log format");
    assert!(
        format.contains("%DYNAMIC_METADATA(envoy.filters.http.ratelimit:sluice:denied_by)%"),
        "{format}"
    );
    assert!(
        read("docs/operations.md").contains(format),
        "docs/operations.md does not show the format of config/envoy/rule-log.yaml: {format}"
    );
}
