//! The quota scenarios of `sluice simulate --rlqs` and their table: one bucket of 600 a
//! minute shared by 2, 10 and 50 Envoys on 1 to 3 replicas, steady, skewed, under the limit,
//! an Envoy going idle and another joining, a burst on a cold bucket, and the same bucket on
//! a fixed window and on a token bucket; each at Envoy 1.40's real 5 s report cadence and
//! at 1 s.

use std::fmt::Write as _;

use super::rlqs::{run, Flow, RlqsReport, RlqsScenario};
use crate::core::{Algorithm, Limit};

/// The window of the quota scenarios' rule.
const W: u64 = 60_000;

/// The rule of the quota scenarios: 600 a minute, sliding (`other_rules`: fixed, bucket).
const LIMIT: Limit = Limit {
    requests_per_unit: 600,
    window_ms: W,
    algorithm: Algorithm::SlidingWindow,
};

/// Traffic to every Envoy of `envoys` over `[from_ms, until_ms)`.
fn flow(from_ms: u64, until_ms: u64, times_limit: f64, envoys: (usize, usize)) -> Flow {
    Flow {
        from_ms,
        until_ms,
        times_limit,
        envoys,
        hot_share: None,
    }
}

/// The replicas a fleet of `envoys` Envoys is served by in the table: 1, 2 or 3.
fn replicas(envoys: usize) -> usize {
    match envoys {
        0..=2 => 1,
        3..=10 => 2,
        _ => 3,
    }
}

/// The quota scenarios at one report cadence (`report_ms`).
pub fn scenarios_at(report_ms: u64) -> Vec<RlqsScenario> {
    let base = |name, envoys: usize, flows: Vec<Flow>, seed| RlqsScenario {
        name,
        envoys,
        replicas: replicas(envoys),
        limit: LIMIT,
        report_ms,
        flows,
        idle_at_ms: None,
        join_at_ms: None,
        windows: 3,
        seed,
    };
    let mut out: Vec<RlqsScenario> = [(2, 0x21_0002), (10, 0x21_0010), (50, 0x21_0050)]
        .into_iter()
        .map(|(n, seed)| base("steady 2x", n, vec![flow(0, 3 * W, 2.0, (0, n))], seed))
        .collect();
    out.push(base(
        "skewed 2x, one Envoy 90 %",
        10,
        vec![Flow {
            hot_share: Some(0.9),
            ..flow(0, 3 * W, 2.0, (0, 10))
        }],
        0x21_0090,
    ));
    out.push(base(
        "under the limit 0.8x, one Envoy 50 %",
        10,
        vec![Flow {
            hot_share: Some(0.5),
            ..flow(0, 3 * W, 0.8, (0, 10))
        }],
        0x21_0008,
    ));
    out.extend(other_rules(report_ms));
    out.push(idle_and_join(report_ms));
    out.push(RlqsScenario {
        windows: 1,
        ..base("cold burst 2x in 100 ms", 10, vec![burst(2.0)], 0x21_00b0)
    });
    out
}

/// The same bucket key on a fixed window and on a token bucket (600 a minute, burst 100):
/// twice the rate, and under it, over ten Envoys on two replicas at `report_ms`.
fn other_rules(report_ms: u64) -> Vec<RlqsScenario> {
    let fixed = Limit {
        algorithm: Algorithm::FixedWindow,
        ..LIMIT
    };
    let bucket = Limit {
        algorithm: Algorithm::TokenBucket { burst: 100 },
        ..LIMIT
    };
    let run = |name, limit, times_limit, seed| RlqsScenario {
        name,
        envoys: 10,
        replicas: 2,
        limit,
        report_ms,
        flows: vec![Flow {
            hot_share: Some(0.5),
            ..flow(0, 300_000, times_limit, (0, 10))
        }],
        idle_at_ms: None,
        join_at_ms: None,
        windows: 3,
        seed,
    };
    vec![
        run("fixed window: 2x, one Envoy 50 %", fixed, 2.0, 0x21_00f2),
        run("fixed window: 0.8x, one Envoy 50 %", fixed, 0.8, 0x21_00f8),
        run(
            "token bucket, burst 100: 2x, one Envoy 50 %",
            bucket,
            2.0,
            0x21_00b2,
        ),
        run(
            "token bucket, burst 100: 0.8x, one Envoy 50 %",
            bucket,
            0.8,
            0x21_00b8,
        ),
    ]
}

/// A cold bucket hit by `times` its limit within the first 100 ms, over ten Envoys.
fn burst(times: f64) -> Flow {
    flow(0, 100, times * W as f64 / 100.0, (0, 10))
}

/// Ten Envoys at twice the limit, Envoy 0 taking half of it; at 70 s Envoy 0 goes idle and
/// its demand moves to the other nine; at 130 s an eleventh Envoy joins them.
pub fn idle_and_join(report_ms: u64) -> RlqsScenario {
    let hot = Flow {
        hot_share: Some(0.5),
        ..flow(0, 70_000, 2.0, (0, 10))
    };
    RlqsScenario {
        name: "idle at 70 s, join at 130 s",
        envoys: 11,
        replicas: 2,
        limit: LIMIT,
        report_ms,
        flows: vec![
            hot,
            flow(70_000, 130_000, 2.0, (1, 10)),
            flow(130_000, 3 * W, 2.0, (1, 11)),
        ],
        idle_at_ms: Some(70_000),
        join_at_ms: Some(130_000),
        windows: 3,
        seed: 0x21_001d,
    }
}

/// Every quota scenario: at 5 s reports, then at 1 s.
pub fn rlqs_scenarios() -> Vec<RlqsScenario> {
    scenarios_at(5_000)
        .into_iter()
        .chain(scenarios_at(1_000))
        .collect()
}

/// Runs every quota scenario and renders the table (what `sluice simulate --rlqs` prints).
pub fn run_rlqs() -> String {
    let reports: Vec<RlqsReport> = rlqs_scenarios().iter().map(run).collect();
    let mut out = String::from(
        "Quota service (RLQS) simulation: simulated Envoy 1.40 rate_limit_quota filters \
         (token buckets and blanket rules as Envoy enforces them, reports every interval), \
         each on one stream to one replica of sluice (the production limiter, sync task and \
         quota streams, on simulated time). One bucket key, 600 a minute: a sliding window unless the scenario says otherwise.\n\
         Admitted and false denials (hits the exact limiter would have admitted) per window, \
         as a share of the limit (a token bucket's: per period of ten fill times, as a share \
         of what an exact bucket fed the same arrivals admitted); idle share reused: reporting \
         intervals after an Envoy goes idle until the token buckets the others run add up to \
         90 % of the limit's rate; a new Envoy's rate: the token bucket of its first assignment and \
         the one it runs two reporting intervals later, as a share of the limit's rate (the ten \
         busy Envoys' even share: 10 %).\n\n",
    );
    out.push_str(&render_rlqs(&reports));
    out
}

/// The Markdown table: one row per quota scenario.
pub fn render_rlqs(reports: &[RlqsReport]) -> String {
    let mut out = String::from(
        "| scenario | Envoys | replicas | reports every | offered/limit | admitted/limit per window \
         | false denials, most in a window | idle share reused after \
         | new Envoy's rate: first assignment, two intervals later |\n\
         | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |\n",
    );
    for r in reports {
        let n = r.windows.len().max(1) as f64;
        let offered = (0..r.windows.len()).map(|i| r.offered(i)).sum::<f64>() / n;
        let admitted: Vec<String> = (0..r.windows.len())
            .map(|i| format!("{:.3}", r.admitted(i)))
            .collect();
        let false_denials = (0..r.windows.len())
            .map(|i| r.false_denials(i))
            .fold(0.0, f64::max);
        let reuse = match r.reuse {
            None => "–".to_string(),
            Some(None) => "never".to_string(),
            Some(Some(k)) => format!("{k} interval{}", if k == 1 { "" } else { "s" }),
        };
        let join = r.join.map_or("–".to_string(), |(now, later)| {
            format!("{:.1} %, {:.1} %", 100.0 * now, 100.0 * later)
        });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} s | {:.2} | {} | {:.1} % | {} | {} |",
            r.scenario,
            r.envoys,
            r.replicas,
            r.report_ms / 1000,
            offered,
            admitted.join(", "),
            100.0 * false_denials,
            reuse,
            join,
        );
    }
    out
}
