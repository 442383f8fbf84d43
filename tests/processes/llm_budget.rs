//! LLM token budgets against a real Envoy 1.40. config/envoy/llm-tokens.yaml: a budget checked
//! on the request path (0 tokens) and charged on stream done with the upstream's
//! `x-tokens-used`, overshooting reports included. config/envoy/llm-reserve.yaml: reserve, then
//! settle (the declared maximum charged up front, the unused part given back on stream done),
//! which never overshoots where charging after does, 50 requests at once against a nearly
//! spent budget; a tenant's request whose `x-max-tokens` is missing or not a positive integer is refused by the route
//! (400) instead of passing a spent budget unchecked, while valid requests reserve and settle
//! as before; and what the per-rule counters add up to for a token dashboard
//! (docs/llm-budgets.md, *The counters*), pinned on 8 reservations of 40,000 that use 10,000.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::common::{header, http, wait_until};
use crate::envoy_e2e::{left, Hold, Stack};

/// The budget of config/rules/llm-reserve.yaml: tokens an hour per tenant.
const BUDGET: u64 = 100_000;

/// A request through Envoy for `tenant` (none if empty) declaring `max` (no header if `None`)
/// and using `used` tokens (what the upstream reports): its status and body.
fn ask(front: SocketAddr, tenant: &str, max: Option<&str>, used: u64) -> (u16, String) {
    let used = used.to_string();
    let mut headers = vec![("x-want-tokens", used.as_str())];
    if !tenant.is_empty() {
        headers.push(("x-tenant", tenant));
    }
    if let Some(max) = max {
        headers.push(("x-max-tokens", max));
    }
    let (status, _, body) = http(front, "GET", "/", "", &headers).expect("through envoy");
    (status, body)
}

/// The per-rule counter `ratelimit_<name>_total` of the tenant rule on sluice's `/metrics`
/// (0 before its first hit).
fn counter(sluice: SocketAddr, name: &str) -> u64 {
    let (_, _, metrics) = http(sluice, "GET", "/metrics", "", &[]).expect("metrics");
    let prefix =
        format!(r#"ratelimit_{name}_total{{domain="llm-reserve",rule="llm-reserve.tenant"}} "#);
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[test]
fn a_tenant_request_without_a_valid_max_tokens_is_refused_not_let_through_a_spent_budget() {
    // An upstream that never holds, and the filter's timeout raised to 5 s: on a busy machine
    // a late answer makes Envoy fail open, which would admit what this test counts on sluice
    // to deny.
    let hold = Hold::open();
    let stack = Stack::start_holding("llm-reserve.yaml", hold.clone());
    let (front, sluice) = (stack.front, stack.sluice_http);

    // The tenant spends its whole budget (the settle gives nothing back: all of it was used).
    let all = BUDGET.to_string();
    assert_eq!(
        ask(front, "acme", Some(&all), BUDGET),
        (200, "hello".into())
    );
    // (0 left, unless the hour turns meanwhile: the sliding window then drains the spent
    // hour by under 30 tokens a second.)
    let spent = left(sluice, "llm-reserve", "tenant", "acme");
    assert!(spent < 1000, "{spent} left");
    // A valid reservation is denied, as before.
    assert_eq!(
        ask(front, "acme", Some("1000"), 0).0,
        429,
        "the budget is spent"
    );

    // Envoy cannot read these as a `hits_addend`: it would drop the reservation's descriptor
    // and the request would reach the app with no check. The route refuses them first.
    let arrived = hold.arrived();
    let bad = [
        None,
        Some("abc"),
        Some("-5000"),
        Some(""),
        Some("0"),
        Some("012"),
        Some("12abc"),
        Some("1e5"),
        Some("1000000000"),
    ];
    for max in bad {
        let (status, body) = ask(front, "acme", max, 10);
        assert_eq!(
            status, 400,
            "x-max-tokens {max:?} on a spent budget must be refused, not let through: {body}"
        );
        assert!(
            body.contains("x-max-tokens must be a positive integer"),
            "{body}"
        );
    }
    // Sent twice: never let through a spent budget either.
    for (first, second) in [
        ("1000", "1000"),
        ("1000", "abc"),
        ("abc", "1000"),
        ("abc", "-1"),
    ] {
        let twice = [
            ("x-tenant", "acme"),
            ("x-max-tokens", first),
            ("x-max-tokens", second),
        ];
        let (status, _, body) = http(front, "GET", "/", "", &twice).expect("through envoy");
        // Two valid values reserve the first (denied here: the budget is spent); a bad
        // one, first or second, refuses the request.
        let want = if (first, second) == ("1000", "1000") {
            429
        } else {
            400
        };
        assert_eq!(
            status, want,
            "x-max-tokens {first:?} then {second:?}: {body}"
        );
    }
    assert_eq!(
        hold.arrived(),
        arrived,
        "a refused request never reaches the app"
    );
    // Refused whatever the budget holds: another tenant's is untouched, and a bad header is
    // refused there too, while a valid one reserves, runs and settles.
    assert_eq!(ask(front, "fresh", Some("abc"), 10).0, 400);
    assert_eq!(ask(front, "fresh", None, 10).0, 400);
    // A refused request charges nothing, not even a valid first value of the header: the
    // rate limit filter does not act on a route that answers directly.
    let twice = [
        ("x-tenant", "fresh"),
        ("x-max-tokens", "1000"),
        ("x-max-tokens", "abc"),
    ];
    assert_eq!(http(front, "GET", "/", "", &twice).unwrap().0, 400);
    assert_eq!(left(sluice, "llm-reserve", "tenant", "fresh"), BUDGET);
    assert_eq!(
        ask(front, "fresh", Some("4000"), 1000),
        (200, "hello".into())
    );
    wait_until(20, "the settle of the 3,000 not used", || {
        left(sluice, "llm-reserve", "tenant", "fresh") >= BUDGET - 1000
    });
    // A request without a tenant carries no budget (the actions send nothing for it): it
    // passes, with or without a maximum.
    assert_eq!(ask(front, "", None, 10).0, 200);
    assert_eq!(ask(front, "", Some("abc"), 10).0, 200);
}

#[test]
fn the_counters_count_a_settle_as_hits_given_back_and_a_denial_as_its_declared_maximum() {
    let stack = Stack::start_holding("llm-reserve.yaml", Hold::open());
    let (front, sluice) = (stack.front, stack.sluice_http);
    let hits = || counter(sluice, "total_hits");
    let tenants = ["dash-a", "dash-b"];

    // 8 requests, one after the other, each declaring 40,000 and using 10,000: each reserves
    // 40,000 and settles 30,000. Four per tenant, so that every reservation fits its tenant's
    // budget (the rule's counters add up its tenants).
    for i in 1..=8u64 {
        let tenant = tenants[i as usize % 2];
        assert_eq!(
            ask(front, tenant, Some("40000"), 10_000).0,
            200,
            "request {i}"
        );
        // The settle is sent when the stream is done, after the response: wait for it to be
        // counted before the next reservation (which might not fit without it).
        wait_until(20, &format!("the settle of request {i}"), || {
            hits() == i * (40_000 + 30_000)
        });
    }
    // total_hits and within_limit: the reservations admitted plus the tokens given back.
    // Neither is the tokens used (80,000): those are the reservations less the settles, which
    // these counters add up instead of subtracting.
    assert_eq!(hits(), 8 * 40_000 + 8 * 30_000);
    assert_eq!(counter(sluice, "within_limit"), 560_000);
    assert_eq!(counter(sluice, "over_limit"), 0);
    // What each tenant has left: the budget less the tokens it used (plus under 30 tokens a
    // second since the hour turned, if it turned meanwhile: the window slides).
    let holds = |l: u64| (BUDGET - 40_000..BUDGET - 39_000).contains(&l);
    for tenant in tenants {
        let l = left(sluice, "llm-reserve", "tenant", tenant);
        assert!(holds(l), "{tenant}: {l} left, after 40,000 used");
    }

    // A reservation that does not fit the 60,000 left: denied, and its declared maximum is
    // counted in total_hits and over_limit, though nothing was charged (`strict: false`).
    assert_eq!(ask(front, "dash-a", Some("70000"), 10_000).0, 429);
    assert_eq!(counter(sluice, "over_limit"), 70_000);
    assert_eq!(hits(), 630_000);
    assert_eq!(counter(sluice, "within_limit"), 560_000);
    let l = left(sluice, "llm-reserve", "tenant", "dash-a");
    assert!(holds(l), "{l} left: the denial charged nothing");
}

fn tenant_hits(sluice: SocketAddr) -> u64 {
    let (_, _, metrics) = http(sluice, "GET", "/metrics", "", &[]).expect("metrics");
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"ratelimit_total_hits_total{domain="llm",rule="llm.tenant"} "#)
        })
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[test]
fn a_token_budget_is_charged_on_stream_done_overshooting_reports_included() {
    let stack = Stack::start("llm-tokens.yaml", &[]);
    let front = stack.front;
    // A request that uses `tokens` (the upstream reports them in `x-tokens-used`).
    let ask = |tenant: &str, tokens: u64| {
        let t = tokens.to_string();
        let h = [("x-tenant", tenant), ("x-want-tokens", t.as_str())];
        http(front, "GET", "/", "", &h).expect("request through envoy")
    };
    // The report is sent after the response: wait until sluice has counted it.
    let counted = |total: u64| {
        wait_until(20, &format!("{total} tokens counted"), || {
            tenant_hits(stack.sluice_http) == total
        })
    };
    // The budget is 1000 tokens a minute; the check charges nothing (1000 left, then 400).
    let (status, headers, body) = ask("acme", 600);
    assert_eq!((status, body.as_str()), (200, "hello"));
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("1000"));
    counted(600);
    let (status, headers, _) = ask("acme", 600);
    assert_eq!(status, 200, "400 tokens are left before this request");
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("400"));
    // This report overshoots the budget (1200 of 1000): still counted, so the next request
    // is denied. (Dropping it, as a denied request's hits once were in sliding windows,
    // left the tenant 400 tokens of room forever.) A minute window that turns meanwhile
    // still weighs the 1200 over 1000 for its first 10 seconds.
    counted(1200);
    let (status, headers, _) = ask("acme", 1);
    assert_eq!(status, 429, "over the budget: {headers:?}");
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("0"));
    // (A 429 has no `x-tokens-used`: Envoy sends no report for it.) Another tenant has a
    // budget of its own.
    assert_eq!(ask("other", 1).0, 200);
}

/// `n` requests through `front` with `headers`, all at once (a thread each), to an upstream
/// that holds its answers on `hold`: once each request was denied or reached the upstream,
/// `while_held` runs, then the upstream answers them all. The statuses, sorted.
fn held_burst(
    front: SocketAddr,
    hold: &Hold,
    n: usize,
    headers: &[(&str, &str)],
    while_held: impl FnOnce(),
) -> Vec<u16> {
    let before = hold.arrived();
    let denied = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        let sent: Vec<_> = (0..n)
            .map(|_| {
                sc.spawn(|| {
                    let (status, ..) = http(front, "GET", "/", "", headers).expect("through envoy");
                    if status != 200 {
                        denied.fetch_add(1, Ordering::SeqCst);
                    }
                    status
                })
            })
            .collect();
        wait_until(30, "every request denied or at the upstream", || {
            hold.arrived() - before + denied.load(Ordering::SeqCst) == n
        });
        while_held();
        hold.release(hold.arrived() - before);
        let mut statuses: Vec<u16> = sent.into_iter().map(|t| t.join().unwrap()).collect();
        statuses.sort_unstable();
        statuses
    })
}

#[test]
fn a_reserved_budget_never_overshoots_where_charging_after_does() {
    // 50 requests at once against a budget with 4 % left, the model server answering only
    // once every one of them was decided (each takes a while to generate).
    const N: usize = 50;

    // Charged after (config/envoy/llm-tokens.yaml: 1000 tokens a minute, a check of 0 tokens,
    // the tokens used reported on stream done): 960 used, then 50 requests of 10 tokens. Each
    // check sees 40 left, so all 50 pass, and their reports charge 500.
    let hold = Arc::new(Hold::default());
    let stack = Stack::start_holding("llm-tokens.yaml", hold.clone());
    let after = [("x-tenant", "after"), ("x-want-tokens", "960")];
    hold.release(1);
    assert_eq!(http(stack.front, "GET", "/", "", &after).unwrap().0, 200);
    wait_until(20, "960 tokens reported", || {
        tenant_hits(stack.sluice_http) == 960
    });
    let used = [("x-tenant", "after"), ("x-want-tokens", "10")];
    let statuses = held_burst(stack.front, &hold, N, &used, || {});
    assert_eq!(statuses, [200; N], "every check passes before any report");
    wait_until(20, "the 50 reports", || {
        tenant_hits(stack.sluice_http) == 960 + 10 * N as u64
    });
    let overshoot_after = (960 + 10 * N as i64 - 1000) as f64 / 1000.0;
    drop(stack);

    // Reserved, then settled (config/envoy/llm-reserve.yaml: 100,000 tokens an hour): 96,000
    // used, then 50 requests that declare 4,000 each and use 1,000. One reservation fits the
    // 4,000 left; the 49 others are denied and charge nothing; the settle gives 3,000 back.
    let hold = Arc::new(Hold::default());
    let stack = Stack::start_holding("llm-reserve.yaml", hold.clone());
    let sluice = stack.sluice_http;
    let tenant_left = || left(sluice, "llm-reserve", "tenant", "reserve");
    let first = [
        ("x-tenant", "reserve"),
        ("x-max-tokens", "96000"),
        ("x-want-tokens", "96000"),
    ];
    hold.release(1);
    assert_eq!(http(stack.front, "GET", "/", "", &first).unwrap().0, 200);
    assert!(tenant_left() >= 4_000, "{}", tenant_left());
    let declared = [
        ("x-tenant", "reserve"),
        ("x-max-tokens", "4000"),
        ("x-want-tokens", "1000"),
    ];
    let mut left_while_held = 0;
    let statuses = held_burst(stack.front, &hold, N, &declared, || {
        left_while_held = tenant_left();
    });
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    assert_eq!(admitted, 1, "one reservation of 4,000 fits: {statuses:?}");
    assert!(statuses[1..].iter().all(|&s| s == 429), "{statuses:?}");
    // While the request ran its 4,000 were held: the budget was spent, never overspent.
    // (An hour that turns meanwhile drains the last one by under 30 tokens a second.)
    assert!(left_while_held < 4_000, "{left_while_held}");
    let peak = 96_000 + 4_000 * admitted as i64;
    let overshoot_reserved = (peak - 100_000) as f64 / 100_000.0;
    // The settle gives back the 3,000 reserved and not used.
    wait_until(20, "the settle", || tenant_left() >= 3_000);
    assert!(
        tenant_left() < 4_000,
        "only the unused part: {}",
        tenant_left()
    );

    assert!(overshoot_reserved <= 0.0, "{overshoot_reserved}");
    assert!(
        overshoot_after > 0.4,
        "charged after, 50 reports overshoot by 46 % of the budget: {overshoot_after}"
    );
}
