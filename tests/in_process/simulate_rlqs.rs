//! The quota service's (RLQS) scenarios of the fleet simulator (`sluice simulate --rlqs`), run
//! as tests with the bounds asserted: simulated Envoy 1.40 filters enforcing sluice's
//! assignments as Envoy does, on streams of the production quota engine over replicas of the
//! production limiter and sync, on paused time with seeded traffic.
//!
//! The bounds (issue 21): admitted at most 1.10× the limit in every window; false denials
//! (hits the exact limiter would have admitted) at most 2 % of the limit in every window while
//! the offered hits stay under the limit; an idle Envoy's share used by the others within two
//! reporting intervals; a new Envoy given a share (a token bucket with a rate) at once, and
//! its fair share within two intervals. Each at Envoy 1.40's real 5 s reports and at 1 s, on
//! the named seed and on others, so that they are not one seed's luck.

use sluice::sim::rlqs::{run, RlqsReport, RlqsScenario};
use sluice::sim::rlqs_matrix::{
    bounds, cell, render_matrix, render_surges, surge, surge_bounds, surge_matrix, Bounds, Scale,
    SCALES,
};
use sluice::sim::{render_rlqs, scenarios_at};

/// At most this many times the limit admitted in any window.
const MAX_ADMITTED: f64 = 1.10;

/// At most this share of the limit falsely denied in any window, under the limit.
const MAX_FALSE_DENIALS: f64 = 0.02;

/// An idle Envoy's share used by the others within this many reporting intervals.
const MAX_REUSE_INTERVALS: u32 = 2;

/// The bounds `r` misses, one line each.
fn misses(r: &RlqsReport) -> Vec<String> {
    let what = format!(
        "{} ({} Envoys, {} replicas, {} s reports)",
        r.scenario,
        r.envoys,
        r.replicas,
        r.report_ms / 1000
    );
    let mut out = Vec::new();
    for i in 0..r.windows.len() {
        if r.admitted(i) > MAX_ADMITTED {
            out.push(format!(
                "{what}: window {} admitted {:.3}× the limit",
                i + 1,
                r.admitted(i)
            ));
        }
        if r.under_limit && r.false_denials(i) > MAX_FALSE_DENIALS {
            out.push(format!(
                "{what}: window {} falsely denied {:.1} % of the limit",
                i + 1,
                100.0 * r.false_denials(i)
            ));
        }
    }
    match r.reuse {
        Some(None) => out.push(format!("{what}: the idle Envoy's share was never reused")),
        Some(Some(k)) if k > MAX_REUSE_INTERVALS => {
            out.push(format!(
                "{what}: the idle Envoy's share reused after {k} intervals"
            ));
        }
        _ => {}
    }
    // A new Envoy gets a prior share at once, and its fair share within two intervals:
    // in the join scenario, a tenth of the rate (ten busy Envoys, one idle), 0.9 of it
    // for the fill's rounding.
    if let Some((first, later)) = r.join {
        if first <= 0.0 {
            out.push(format!(
                "{what}: the new Envoy's first assignment had no rate"
            ));
        }
        let fair = 1.0 / (r.envoys - 1) as f64;
        // 1e-9: a rate of exactly 0.9 of the fair share holds (0.9 × 0.1 is 0.0900…01).
        if later < 0.9 * fair - 1e-9 {
            out.push(format!(
                "{what}: the new Envoy ran {:.1} % of the rate two intervals in (fair: {:.1} %)",
                100.0 * later,
                100.0 * fair
            ));
        }
    }
    out
}

/// Runs `scenarios` and fails listing every bound missed, with the table of the runs.
fn check(scenarios: &[RlqsScenario]) {
    let reports: Vec<RlqsReport> = scenarios.iter().map(run).collect();
    let failures: Vec<String> = reports.iter().flat_map(misses).collect();
    assert!(
        failures.is_empty(),
        "{}\n\n{}",
        failures.join("\n"),
        render_rlqs(&reports)
    );
}

/// The table's scenarios at `report_ms`, the 50-Envoy one left to `fifty_envoys` (it costs
/// as much as the others together in a debug build).
fn named(report_ms: u64) -> Vec<RlqsScenario> {
    scenarios_at(report_ms)
        .into_iter()
        .filter(|s| s.envoys < 50)
        .collect()
}

/// `scenarios` on seed `k` of the other seeds, derived from each named one as the window
/// scenarios' are.
fn reseeded(scenarios: Vec<RlqsScenario>, k: u64) -> Vec<RlqsScenario> {
    scenarios
        .into_iter()
        .map(|s| s.reseeded(s.seed.wrapping_mul(0x9e37_79b9).wrapping_add(k)))
        .collect()
}

#[test]
fn the_bounds_hold_at_envoys_five_second_reports() {
    check(&named(5_000));
}

#[test]
fn the_bounds_hold_at_one_second_reports() {
    check(&named(1_000));
}

#[test]
fn the_bounds_hold_with_fifty_envoys_on_three_replicas() {
    let fifty: Vec<RlqsScenario> = [5_000, 1_000]
        .into_iter()
        .flat_map(scenarios_at)
        .filter(|s| s.envoys == 50)
        .collect();
    check(&fifty);
}

#[test]
fn the_bounds_hold_on_other_seeds() {
    for k in 1..=5u64 {
        check(&reseeded(named(5_000), k));
        check(&reseeded(named(1_000), k));
    }
}

#[test]
fn the_same_scenario_gives_the_same_report() {
    let mut s = scenarios_at(5_000).remove(1);
    s.windows = 1;
    assert_eq!(run(&s), run(&s));
}

/// A cell of the scale matrix: its rule, (Envoys, replicas), report interval (ms) and
/// offered load over the limit.
type Cell = (&'static Scale, (usize, usize), u64, f64);

/// Runs each cell and fails listing what `judge` finds amiss in its bounds, cell by cell,
/// with the matrix of the runs.
fn check_cells(cells: &[Cell], judge: impl Fn(&Cell, &Bounds) -> Vec<String>) {
    let mut failures = Vec::new();
    let mut reports = Vec::new();
    for c in cells {
        let &(scale, fleet, report_ms, times) = c;
        let r = run(&cell(scale, fleet, report_ms, times));
        let what = format!(
            "{}, {} Envoys, {report_ms} ms reports, {times}x",
            scale.name, fleet.0
        );
        failures.extend(
            judge(c, &bounds(&r))
                .into_iter()
                .map(|f| format!("{what}: {f}")),
        );
        reports.push(r);
    }
    assert!(
        failures.is_empty(),
        "{}\n\n{}",
        failures.join("\n"),
        render_matrix(&reports)
    );
}

/// Over the limit, up to ten Envoys of equal demand within 15 % of their mean.
fn unfair((envoys, _): (usize, usize), times: f64, b: &Bounds) -> Option<String> {
    (times > 1.0 && envoys <= 10 && b.spread > 0.15)
        .then(|| format!("Envoys {:.1} % apart", 100.0 * b.spread))
}

/// The scale matrix's cells held to both bounds: a 50/s bucket of burst 50 (one second of
/// its rate) shared by one and two Envoys, at 1 s and 5 s reports, over the limit and under
/// it, by ten Envoys on two replicas over it and under it at 1 s reports, and by fifty on
/// three over it. After the first period (ten fill times) the fleet admits 0.90–1.10× what
/// an exact bucket fed the same arrivals admits, and over the limit each Envoy of up to ten
/// within 15 % of the mean; under it, at least 0.98× (nearly everything offered). The cells
/// that still miss are in docs/accuracy.md, with why.
#[test]
fn a_per_second_bucket_admits_its_whole_limit_and_no_more() {
    let bucket = &SCALES[0];
    let mut cells = Vec::new();
    for fleet in [(1, 1), (2, 1)] {
        for report_ms in [1_000, 5_000] {
            for times in [2.0, 0.8] {
                cells.push((bucket, fleet, report_ms, times));
            }
        }
    }
    cells.extend([
        (bucket, (10, 2), 1_000, 2.0),
        (bucket, (10, 2), 5_000, 2.0),
        (bucket, (10, 2), 1_000, 0.8),
        (bucket, (50, 3), 1_000, 2.0),
        (bucket, (50, 3), 5_000, 2.0),
    ]);
    check_cells(&cells, |&(_, fleet, _, times), b| {
        let mut out = Vec::new();
        if !(0.90..=1.10).contains(&b.later) {
            out.push(format!("admitted {:.3}x the exact bucket", b.later));
        }
        if times < 1.0 && b.later < 0.98 {
            out.push(format!("admitted {:.3}x under the limit", b.later));
        }
        out.extend(unfair(fleet, times, b));
        out
    });
}

/// The cold start at per-second limits, from both sides: a 50/s sliding window shared by one,
/// two and ten Envoys (on one, one and two replicas) at 1 s and 5 s reports, and a 50/s
/// bucket of burst 50 shared by two Envoys at 5 s reports, admit at most 1.10× what the exact
/// limiter fed the same arrivals admits in their first period (a window's first second, a
/// bucket's first ten seconds), and at twice the limit at least 0.90× of it. Before, a
/// window's first grant was its room at once and a second of rate on top (1.58–1.98× in the
/// first second), and the first of two Envoys kept the whole rate it got alone until its
/// first report (1.13× a bucket's first ten seconds). Fifty Envoys on a window still miss
/// (docs/accuracy.md says why).
#[test]
fn a_cold_per_second_limit_admits_its_limit_from_the_first_period() {
    let mut cells = Vec::new();
    for fleet in [(1, 1), (2, 1), (10, 2)] {
        for report_ms in [1_000, 5_000] {
            for times in [2.0, 0.8] {
                cells.push((&SCALES[1], fleet, report_ms, times));
            }
        }
    }
    cells.push((&SCALES[0], (2, 1), 5_000, 2.0));
    check_cells(&cells, |&(_, _, _, times), b| {
        let mut out = Vec::new();
        if b.first > 1.10 {
            out.push(format!("first period {:.3}x the exact", b.first));
        }
        if times >= 1.5 && b.first < 0.90 {
            out.push(format!("first period only {:.3}x", b.first));
        }
        out
    });
}

/// Prints the scale matrix (`SCALE=` picks rules by name): the table in docs/accuracy.md.
#[test]
#[ignore]
fn scale_matrix() {
    let only = std::env::var("SCALE").unwrap_or_default();
    let cells: Vec<RlqsScenario> = sluice::sim::rlqs_matrix::matrix()
        .into_iter()
        .filter(|s| s.name.contains(&only))
        .collect();
    let reports: Vec<RlqsReport> = cells.iter().map(run).collect();
    println!("{}", render_matrix(&reports));
}

/// Prints the surges after a quiet spell (`SCALE=` picks rules by name): the table in
/// docs/accuracy.md.
#[test]
#[ignore]
fn surges() {
    let only = std::env::var("SCALE").unwrap_or_default();
    let cells: Vec<(&Scale, RlqsReport)> = surge_matrix()
        .into_iter()
        .filter(|(scale, _)| scale.name.contains(&only))
        .map(|(scale, s)| (scale, run(&s)))
        .collect();
    println!("{}", render_surges(&cells));
}

/// A surge to three times the limit after a quiet spell at half of it, from both sides: the
/// per-second bucket and the per-minute window, each shared by one to fifty Envoys, at 1 s
/// and 5 s reports, admit 0.90–1.10× what the exact limiter fed the same arrivals admits in
/// the surge's first period (the quiet fleet's buckets are full as it begins) and after it,
/// and at most 1.10× in the quiet spell. A per-second window misses (up to twice the exact
/// limiter in the surge's first second): docs/accuracy.md says why.
#[test]
fn a_surge_after_a_quiet_spell_admits_its_limit_both_ways() {
    let (bucket, minute) = (&SCALES[0], &SCALES[2]);
    let mut cells = Vec::new();
    for report_ms in [1_000, 5_000] {
        for fleet in [(1, 1), (2, 1), (10, 2), (50, 3)] {
            cells.push((bucket, fleet, report_ms));
            cells.push((minute, fleet, report_ms));
        }
    }
    let mut failures = Vec::new();
    let mut reports = Vec::new();
    for (scale, fleet, report_ms) in cells {
        let r = run(&surge(scale, fleet, report_ms));
        let b = surge_bounds(scale, &r);
        let what = format!("{}, {} Envoys, {report_ms} ms reports", scale.name, fleet.0);
        if b.quiet > MAX_ADMITTED {
            failures.push(format!("{what}: {:.3}x in the quiet spell", b.quiet));
        }
        for (when, got) in [("as the surge began", b.first), ("after it", b.after)] {
            if !(0.90..=MAX_ADMITTED).contains(&got) {
                failures.push(format!("{what}: {got:.3}x {when}"));
            }
        }
        reports.push((scale, r));
    }
    assert!(
        failures.is_empty(),
        "{}\n\n{}",
        failures.join("\n"),
        render_surges(&reports)
    );
}

/// The scale matrix's per-minute (600) and per-hour (3,600) windows held to both bounds,
/// the first window included: 0.90–1.10× what the exact limiter admits at twice the limit,
/// at least 0.98× under it, and Envoys of equal demand within 15 % of the mean, for one to
/// ten Envoys at 1 s and 5 s reports (the hour at Envoy's 5 s only: an hour of 1 s reports
/// costs twice as much in a debug build, and the table's 1 s rows agree with the 5 s ones);
/// fifty Envoys over the limit and under it.
#[test]
fn per_minute_and_per_hour_windows_admit_their_limit_both_ways() {
    let (minute, hour) = (&SCALES[2], &SCALES[3]);
    let mut cells = Vec::new();
    for fleet in [(1, 1), (2, 1), (10, 2)] {
        for times in [2.0, 0.8] {
            cells.push((minute, fleet, 1_000, times));
            cells.push((minute, fleet, 5_000, times));
            cells.push((hour, fleet, 5_000, times));
        }
    }
    cells.extend([
        (minute, (50, 3), 1_000, 2.0),
        (minute, (50, 3), 5_000, 2.0),
        (minute, (50, 3), 1_000, 0.8),
        (minute, (50, 3), 5_000, 0.8),
        (hour, (50, 3), 5_000, 2.0),
        (hour, (50, 3), 5_000, 0.8),
    ]);
    check_cells(&cells, |&(_, fleet, _, times), b| {
        let mut out = Vec::new();
        for (period, got) in [("first", b.first), ("later", b.later)] {
            if got > MAX_ADMITTED || (times > 1.0 && got < 0.90) || (times < 1.0 && got < 0.98) {
                out.push(format!(
                    "{period} window(s) admitted {got:.3}x the exact limiter"
                ));
            }
        }
        out.extend(unfair(fleet, times, b));
        out
    });
}
