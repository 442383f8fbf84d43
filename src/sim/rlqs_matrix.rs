//! The quota service's scale matrix (`sluice simulate --rlqs`, after the scenario table): the
//! limits people write — per second (a token bucket whose burst is one second of its rate, and
//! a sliding window), per minute and per hour — shared by 1, 2, 10 and 50 Envoys on 1 to 3
//! replicas, at 1 s and 5 s reports, under the limit (0.8×) and over it (2×), each measured
//! from both sides against the exact limiter fed the same arrivals, with the spread between
//! Envoys of equal demand; and a surge after a quiet spell on the same rules ([`surge`]).

use std::fmt::Write as _;

use super::rlqs::{run, Flow, RlqsReport, RlqsScenario};
use crate::core::{Algorithm, Limit};

/// One rule of the matrix: its name in the table, its limit, and how many periods are run
/// (a window, or a bucket's ten fill times: `sim::period_ms`).
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    /// Shown in the table.
    pub name: &'static str,
    /// The rule's limit.
    pub limit: Limit,
    /// Periods run: enough for the shares to settle after the first.
    pub periods: u64,
}

/// The matrix's rules.
pub const SCALES: [Scale; 4] = [
    Scale {
        name: "50/s bucket, burst 50",
        limit: Limit {
            requests_per_unit: 50,
            window_ms: 1_000,
            algorithm: Algorithm::TokenBucket { burst: 50 },
        },
        periods: 3,
    },
    Scale {
        name: "50/s sliding window",
        limit: Limit {
            requests_per_unit: 50,
            window_ms: 1_000,
            algorithm: Algorithm::SlidingWindow,
        },
        periods: 30,
    },
    Scale {
        name: "600/min sliding window",
        limit: Limit {
            requests_per_unit: 600,
            window_ms: 60_000,
            algorithm: Algorithm::SlidingWindow,
        },
        periods: 3,
    },
    Scale {
        name: "3600/h sliding window",
        limit: Limit {
            requests_per_unit: 3_600,
            window_ms: 3_600_000,
            algorithm: Algorithm::SlidingWindow,
        },
        periods: 2,
    },
];

/// The fleets of the matrix: (Envoys, replicas).
pub const FLEETS: [(usize, usize); 4] = [(1, 1), (2, 1), (10, 2), (50, 3)];

/// The offered loads of the matrix, as multiples of the limit.
pub const DEMANDS: [f64; 2] = [2.0, 0.8];

/// The matrix's scenario for one rule, fleet, report interval and demand: the traffic spread
/// evenly over the Envoys (each hit to one drawn at random), for the whole run.
pub fn cell(
    scale: &Scale,
    (envoys, replicas): (usize, usize),
    report_ms: u64,
    times: f64,
) -> RlqsScenario {
    let period = super::period_ms(&super::Scenario {
        limit: scale.limit,
        ..super::windows::base()
    });
    let seed = 0x28_0000
        ^ ((envoys as u64) << 8)
        ^ (report_ms / 1000)
        ^ (((times * 10.0) as u64) << 16)
        ^ (scale.limit.window_ms << 24);
    RlqsScenario {
        name: scale.name,
        envoys,
        replicas,
        limit: scale.limit,
        report_ms,
        flows: vec![Flow {
            from_ms: 0,
            until_ms: scale.periods * period,
            times_limit: times,
            envoys: (0, envoys),
            hot_share: None,
        }],
        idle_at_ms: None,
        join_at_ms: None,
        windows: scale.periods,
        seed,
    }
}

/// Every cell of the matrix.
pub fn matrix() -> Vec<RlqsScenario> {
    let mut out = Vec::new();
    for scale in &SCALES {
        for report_ms in [1_000, 5_000] {
            for fleet in FLEETS {
                for times in DEMANDS {
                    out.push(cell(scale, fleet, report_ms, times));
                }
            }
        }
    }
    out
}

/// One cell's figures, each a ratio to what the exact limiter fed the same arrivals admits
/// ([`RlqsReport::expected`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// The first period (cold start, shares not yet settled).
    pub first: f64,
    /// The periods after it, together.
    pub later: f64,
    /// The most admitted in one period.
    pub worst: f64,
    /// The most falsely denied in one period, as a share of its expected.
    pub false_denials: f64,
    /// Envoys of equal demand: the largest distance of one's admitted hits from their mean,
    /// over the mean (after the first period).
    pub spread: f64,
}

/// The figures of `r`.
pub fn bounds(r: &RlqsReport) -> Bounds {
    let n = r.windows.len();
    let ratio = |a: u64, e: u64| a as f64 / e.max(1) as f64;
    let first = ratio(r.windows[0].admitted, r.expected(0));
    let (a, e) = (1..n).fold((0, 0), |(a, e), i| {
        (a + r.windows[i].admitted, e + r.expected(i))
    });
    let later = if n > 1 { ratio(a, e) } else { first };
    let worst = (0..n)
        .map(|i| ratio(r.windows[i].admitted, r.expected(i)))
        .fold(0.0, f64::max);
    let false_denials = (0..n)
        .map(|i| ratio(r.windows[i].false_denials, r.expected(i)))
        .fold(0.0, f64::max);
    let admitted: Vec<f64> = r.per_envoy.iter().map(|&(a, _)| a as f64).collect();
    let mean = admitted.iter().sum::<f64>() / admitted.len().max(1) as f64;
    let spread = if mean > 0.0 {
        admitted
            .iter()
            .map(|a| (a - mean).abs() / mean)
            .fold(0.0, f64::max)
    } else {
        0.0
    };
    Bounds {
        first,
        later,
        worst,
        false_denials,
        spread,
    }
}

/// Runs the matrix and renders its table.
pub fn run_matrix() -> String {
    let reports: Vec<RlqsReport> = matrix().iter().map(run).collect();
    render_matrix(&reports)
}

/// The Markdown table of the matrix: one row per cell.
pub fn render_matrix(reports: &[RlqsReport]) -> String {
    let mut out = String::from(
        "| rule | Envoys | replicas | reports every | offered/limit | admitted/exact, first period \
         | admitted/exact, later | most in a period | false denials, most in a period \
         | spread between equal Envoys |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in reports {
        let b = bounds(r);
        let offered =
            (0..r.windows.len()).map(|i| r.offered(i)).sum::<f64>() / r.windows.len().max(1) as f64;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} s | {:.1} | {:.3} | {:.3} | {:.3} | {:.1} % | {:.1} % |",
            r.scenario,
            r.envoys,
            r.replicas,
            r.report_ms / 1000,
            offered,
            b.first,
            b.later,
            b.worst,
            100.0 * b.false_denials,
            100.0 * b.spread,
        );
    }
    out
}

/// The offered loads of a surge after a quiet spell ([`surge`]), as multiples of the limit.
pub const SURGE: (f64, f64) = (0.5, 3.0);

/// A surge after a quiet spell on `scale`'s rule: [`Scale::periods`] periods at half the
/// limit, spread evenly over the Envoys as in [`cell`], then half as many (rounded up) at
/// three times it. The steady cells never show it: a quiet fleet's buckets are full, and
/// whatever they hold at once is admitted on top of their rates as the surge begins.
pub fn surge(scale: &Scale, fleet: (usize, usize), report_ms: u64) -> RlqsScenario {
    let mut s = cell(scale, fleet, report_ms, SURGE.0);
    let period = s.flows[0].until_ms / scale.periods.max(1);
    let (quiet, loud) = (scale.periods, scale.periods.div_ceil(2));
    s.windows = quiet + loud;
    s.flows.push(Flow {
        from_ms: quiet * period,
        until_ms: (quiet + loud) * period,
        times_limit: SURGE.1,
        ..s.flows[0]
    });
    s.seed ^= 0x5_0000_0000;
    s
}

/// A surge's figures, each a ratio to what the exact limiter fed the same arrivals admits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SurgeBounds {
    /// The most admitted in one period of the quiet spell.
    pub quiet: f64,
    /// The surge's first period.
    pub first: f64,
    /// The surge's periods after its first, together.
    pub after: f64,
}

/// The figures of a [`surge`]'s report `r` on `scale`.
pub fn surge_bounds(scale: &Scale, r: &RlqsReport) -> SurgeBounds {
    let quiet = usize::try_from(scale.periods).unwrap_or(usize::MAX);
    let ratio = |a: u64, e: u64| a as f64 / e.max(1) as f64;
    let n = r.windows.len();
    let (a, e) = (quiet + 1..n).fold((0, 0), |(a, e), i| {
        (a + r.windows[i].admitted, e + r.expected(i))
    });
    SurgeBounds {
        quiet: (0..quiet.min(n))
            .map(|i| ratio(r.windows[i].admitted, r.expected(i)))
            .fold(0.0, f64::max),
        first: ratio(r.windows[quiet].admitted, r.expected(quiet)),
        after: ratio(a, e),
    }
}

/// The surges of the matrix: the per-second and per-minute rules (an hour's would run for
/// hours of simulated time), every fleet, 1 s and 5 s reports.
pub fn surge_matrix() -> Vec<(&'static Scale, RlqsScenario)> {
    let mut out = Vec::new();
    for scale in &SCALES[..3] {
        for report_ms in [1_000, 5_000] {
            for fleet in FLEETS {
                out.push((scale, surge(scale, fleet, report_ms)));
            }
        }
    }
    out
}

/// The Markdown table of surges: one row per cell.
pub fn render_surges(cells: &[(&Scale, RlqsReport)]) -> String {
    let mut out = String::from(
        "| rule | Envoys | replicas | reports every | most in a quiet period | the surge's first \
         period | the surge after it |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (scale, r) in cells {
        let b = surge_bounds(scale, r);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} s | {:.3} | {:.3} | {:.3} |",
            r.scenario,
            r.envoys,
            r.replicas,
            r.report_ms / 1000,
            b.quiet,
            b.first,
            b.after,
        );
    }
    out
}
