//! The fleet simulator's scenarios (`sluice simulate`), run as tests with their bounds asserted.
//!
//! The simulator runs the production request path and sync task on paused tokio time with
//! seeded traffic, so it is deterministic and each bound is checked against the same numbers
//! docs/accuracy.md's table shows. The target bounds (ARCHITECTURE.md, "Targets") (20 nodes: a cold entity at 10× its limit
//! admits at most 1.10× the limit in its first window; steady 2× at most 1.05× per window;
//! false denials at most 2 % of the limit) apply to sluice; the plain design runs beside it to
//! show that the mechanism is what meets them. The bounds of the other scenarios are what
//! sluice measures with some margin, each stated where asserted. Where the shipped code misses
//! a target bound (ARCHITECTURE.md, "Targets"), the assertion holds it to what it achieves (with a small margin) and
//! says which issue tightens it. The same bounds are then checked on other seeds, so that
//! they are not one seed's luck.

use sluice::sim::{render_table, run, scenarios, Scenario};

/// the targets (ARCHITECTURE.md, "Targets"): false denials at most 2 % of the limit (of a
/// bucket: of the exact bucket's admitted hits), in every window of every scenario.
/// Measured: at most 1.3 % over the six seeds outside the within-a-tick bursts, in the
/// moments before a limit is reached; in the bursts 0 % at 2 and 4 replicas, 0–0.5 % at 20
/// and 0.7–1.8 % at 50 (2.2–3.9 % at 50 with a burst read under way at a time and a slack
/// of 1.3, before two went at once: `global/sync/shard.rs`, `core/prior.rs`).
const MAX_FALSE_DENIALS: f64 = 0.02;

/// The least admitted, as a multiple of what the exact limiter admits, in any window whose
/// demand is at least 1.5× that (the lower bound every scenario is held to).
const MIN_ADMITTED: f64 = 0.90;

/// With `strict` on, the least a scenario's first window admits, over what was offered up
/// to the limit.
const STRICT_FLOOR: f64 = 0.95;

/// What a scenario's run must show besides `MAX_FALSE_DENIALS`: the most sluice admits
/// from a window on, and the least it admits (so that it does not keep within bounds by
/// denying), or the least the plain design admits (so that the scenario is one it fails).
struct Bounds {
    /// (first window, most admitted): at most that many times the limit in every window
    /// from the first on; checked in this order.
    at_most: &'static [(usize, f64)],
    at_least: Option<Floor>,
    /// The plain design admits at least this many times the limit in the first window.
    plain_at_least: Option<f64>,
}

/// The least sluice admits, as a multiple of the limit (of the exact bucket's admitted).
enum Floor {
    /// In one window; `what` opens the failure ("outage window admitted only").
    Window {
        window: usize,
        min: f64,
        what: &'static str,
    },
    /// In every period of a bucket.
    EveryPeriod(f64),
}

/// Bounds of at most `at_most` alone; the methods below add a floor.
fn within(at_most: &'static [(usize, f64)]) -> Bounds {
    Bounds {
        at_most,
        at_least: None,
        plain_at_least: None,
    }
}

impl Bounds {
    fn at_least(self, window: usize, min: f64, what: &'static str) -> Bounds {
        let at_least = Some(Floor::Window { window, min, what });
        Bounds { at_least, ..self }
    }

    fn every_period_at_least(self, min: f64) -> Bounds {
        let at_least = Some(Floor::EveryPeriod(min));
        Bounds { at_least, ..self }
    }

    fn plain_at_least(self, min: f64) -> Bounds {
        let plain_at_least = Some(min);
        Bounds {
            plain_at_least,
            ..self
        }
    }
}

/// The bounds of each scenario, by name (a declarative table: one row per scenario or
/// group of scenarios, with what was measured and why it holds).
fn bounds(name: &str) -> Option<Bounds> {
    Some(match name {
        "cold surge 10x" => {
            // the targets (ARCHITECTURE.md, "Targets"): the first window of a cold entity at 10× stays within 1.10×.
            // Measured: 1.001–1.007 over the six seeds, false denials 0.4–0.9 % (1.024–1.038
            // and 0.1 % before settled replicas re-read the count as they spend their share
            // in a surge, `core/fleet.rs`; the plain design: 9.8–10.0×).
            // Then the steady state at 10×, held to the steady target. Measured ≤ 1.006.
            // The plain design admits about ρ× in the first window (ARCHITECTURE.md, "The plain design"): the mechanism,
            // not the scenario, is what keeps sluice within bounds.
            within(&[(0, 1.10), (1, 1.05)]).plain_at_least(5.0)
        }
        "steady 2x" => {
            // the targets (ARCHITECTURE.md, "Targets"): steady 2× stays within 1.05× in every window (cold start included).
            // Measured ≤ 1.006; the plain design admits 2.0× in the first window.
            within(&[(0, 1.05)]).plain_at_least(1.5)
        }
        "one hot node" => {
            // Node 0 has half the traffic: its share of the room follows its share of the
            // count, so uneven load costs no accuracy. Measured ≤ 1.010.
            within(&[(0, 1.03)])
        }
        "epoch rollover" => {
            // Syncs in flight across boundaries (40 ms round trip) lose or double nothing, and
            // the rate measured across a boundary counts both epochs. Measured ≤ 1.001.
            within(&[(0, 1.03)])
        }
        "redis outage" => {
            // 30 s without the store: each node keeps to its share of the room as the window
            // drains, then catches up with the count when the store is back. Measured
            // 0.994–1.005 in the outage's window; held to 3 % either way.
            within(&[(0, 1.03)]).at_least(1, 0.97, "outage window admitted only")
        }
        "redis restart" => {
            // the targets (ARCHITECTURE.md, "Targets"): Redis restarting empty stays within
            // 1.10×. Each replica's next sync puts its acknowledged part back, so the count
            // the fleet reads is whole again within a sync interval. Measured 0.999–1.002 in
            // the restart's window over the six seeds, ≤ 1.003 in every window (1.471 when a
            // restart lost the count, before key version 2); held to 3 % either way as well.
            within(&[(0, 1.10), (0, 1.03)]).at_least(1, 0.97, "restart window admitted only")
        }
        "2-replica surge" => {
            // the targets (ARCHITECTURE.md, "Targets") hold 2 nodes hit within one tick to
            // 1.10×. Each node keeps to its prior (half the limit) until its first reply is a
            // tick old, by which time the count shows the other's hits. Measured 1.015–1.047
            // on the six seeds (1.050 on each before young replicas sent their hits at a
            // quarter of their prior: both reached their prior, 315 of 600; the plain design:
            // 1.75–2.07×; before the prior, 1.68–1.81×).
            within(&[(0, 1.10)])
        }
        "edge surge, 2 nodes" | "edge surge, 2 nodes, strict" => {
            // the targets: a cold surge within 1.10×, here on two replicas at 1,000 requests a
            // second alternating, a rule of 600 an hour (issue 19, item 11). Each replica
            // keeps to its prior (315) and sends it as soon as it is spent, so the other
            // settles on a read that holds it (`core/prior.rs`, `wants_prior_sync`).
            // Measured 1.018–1.048 on the six seeds, strict or not (1.050 before young
            // replicas also sent at a quarter of their prior); before that send, a replica
            // whose tick came early in the surge settled on a read missing part of the
            // other's prior and took a share of room already spent: up to 1.31× (40 seeds).
            within(&[(0, 1.10)]).at_least(0, 0.95, "admitted only")
        }
        "slow surge, 2 nodes" | "slow surge, 4 nodes" => {
            // the targets: a cold surge within 1.10×, here reaching the limit one to two
            // seconds in, after the replicas settled (issue 19, item 11). A young replica
            // sends its hits once they are a quarter of its prior, a settled one re-reads the
            // count as it spends its share of the room while the others add a good part of
            // the limit in a tick, and the others' rate over less than a second is blended
            // with the rate before (`core/fleet.rs`, `core/prior.rs`). Measured 1.000 (2
            // replicas) and 1.000–1.002 (4) on the six seeds, 1.000–1.003 over 30, strict or
            // not, false denials at most 0.5 %. Before: 1.052–1.247 and 1.145–1.223 over 30
            // seeds (1.195 and 1.148 on the named ones).
            within(&[(0, 1.10)]).at_least(0, 0.95, "admitted only")
        }
        "burst 2x, 2 nodes"
        | "burst 2x, 4 nodes"
        | "burst 10x, 20 nodes"
        | "burst 10x, 50 nodes" => {
            // the targets: a cold entity hit within one tick stays within 1.10×. Each replica
            // keeps to its prior, 1.05 × limit / N, and re-splits the room left at each burst
            // read with a binomial share's spread, at most a slack of 1.7 (`core/prior.rs`).
            // Measured 1.012–1.019 at 2 and 4 replicas, 1.082–1.091 at 20, 1.077–1.094 at 50
            // (1.040–1.050 on the prior alone).
            within(&[(0, 1.10)]).at_least(0, 0.95, "admitted only")
        }
        "start together, 2 nodes" => {
            // Two replicas started within a second of each other, the second 50 ms before
            // the surge at the edge (1,000 requests a second in turn on 600 an hour): each
            // counts the other before it reports ready, and they turn ready within a few
            // milliseconds of each other (`global/join.rs`), so the surge meets a fleet of
            // two young priors. The targets, and at least 0.90× what the exact limiter
            // admits (the limit). Measured 1.035–1.048 over the six seeds (1.025–1.048 over
            // 30), strict or not, false denials ≤ 0.3 %; before the join, the replica that
            // started first decided as if alone until its next tick: 1.040–1.193.
            within(&[(0, 1.10)]).at_least(0, 0.90, "admitted only")
        }
        "join mid-surge, 3 nodes" => {
            // A third replica starts within the first 400 ms of the surge, while the value is
            // young on the two running ones. It serves once both counted it; meanwhile each
            // running one that counts it keeps the value, young since before, to the prior
            // of the count before (half the limit, not a third) and to its even share of
            // the room each reply leaves (`core/window/prior.rs`), and the newcomer takes its
            // share of the room its first reply shows. The targets, as every scenario, and
            // at least 0.90× what the exact limiter admits. Measured 1.003–1.070 over the
            // six seeds (0.998–1.070 over 30), false denials 0–1.2 % (2.0 % over 30); with
            // `strict` on 1.003–1.068, 0–1.2 % (0.987–1.068, 2.3 % over 30). When the
            // running ones kept it to the prior of the count of three, a replica not serving
            // yet counted: 0.998–1.047 with 0.2–19.2 % of the limit denied early (admitted
            // later in the window), and with `strict` on, where those denials count,
            // 0.873–1.045; before the join, 1.000–1.132.
            within(&[(0, 1.10)]).at_least(0, 0.90, "admitted only")
        }
        "departure" => {
            // the targets: a replica leaving keeps the fleet within 1.10×. The others stop
            // projecting its traffic once its heartbeat is gone, and take its traffic over
            // with their measured shares at the next reads. Measured ≤ 1.006 in every
            // window, 0.997–1.000 in the departure's.
            within(&[(0, 1.10)]).at_least(1, 0.97, "departure window admitted only")
        }
        "bucket warm flood, 20 nodes" | "bucket warm flood, 4 nodes" => {
            // A fleet settled on a full bucket (half the rate), then 5× the burst within
            // 100 ms everywhere. Each node re-reads the bucket once it spent an eighth of its
            // allowance or of its even share (settled burst reads, `core/bucket_burst.rs`),
            // so the spreads are taken on what the reads show, not all at once; others spending
            // far above the refill shrink the spread (`FLOOD_PACE`, `core/bucket.rs`). A
            // node's pending spends from before it last saw the bucket full are counted, not
            // spent again (`BucketPlan::spend`). Measured over the six seeds in the flood's period:
            // 1.067–1.091 at 20 nodes (false denials 0.5–1.9 %), 1.014–1.033 at 4 (0–1.4 %).
            // Re-reading at a quarter: 1.086–1.124 at 20 (held to 1.13 then), 1.014–1.043 at 4.
            // Before runs: 1.057–1.105 and 1.000–1.048, with 4.8 % false denials at 4 (the
            // stale spends stacked on the flood's read as debt, which at 20 also hid part of
            // the overspend); with runs and no shrinking spread, 1.158–1.187 and 1.062–1.081.
            // The target, with no exception.
            within(&[(0, 1.10)]).at_least(1, 0.95, "admitted only")
        }
        name if name.starts_with("bucket ") => {
            // the targets: buckets within 1.10× the exact bucket, per period (ten fill times
            // of the bucket, at least 10 s: `sim::period_ms`), false denials within 2 % of
            // the exact bucket's admitted hits. Each node
            // spends its share of the room its last read left plus the refill since, with
            // three binomial deviations (at most the share), re-reading the bucket a round
            // trip later once it spent a quarter of that; a young one its prior, or its even
            // share of what its burst reads show (`core/bucket.rs`). Measured over the six
            // seeds, admitted over the exact bucket's / false denials:
            // - cold burst, 20 nodes: 1.024–1.091 / 0–1.4 % (1.010–1.081 / 1.0–2.9 % with
            //   a young read's lag taken as half a gap, `BUCKET_BURST_LAG`; before burst
            //   reads and the spread, 0.957 / 12.9 %);
            // - cold burst, 4 nodes: 1.024–1.033 / 0–0.5 %;
            // - steady 2x, 20 nodes: 1.000–1.002 / 0.2–0.4 % (1.010–1.026 / 1.8–2.0 %
            //   before settled burst reads);
            // - steady 2x, 4 nodes: 1.000–1.012 / 0.3–0.6 % (1.000–1.000 / 0.6–1.8 % before
            //   runs, 1.007–1.040 / 0.6–2.4 % before settled burst reads);
            // - bursty human, 4 nodes: 1.007–1.018 / 0–0.7 %;
            // - bursty human, 20 nodes: 1.015–1.024 / 1.1–2.0 % (before the even floor of
            //   the shares, the gross pressure and the spread, 26–82 % per 10 s).
            // And not by denying: at least 0.95× the exact bucket in every period.
            within(&[(0, 1.10)]).every_period_at_least(0.95)
        }
        _ => return None,
    })
}

fn check(s: &Scenario) -> Result<(), String> {
    let r = run(s);
    let table = render_table(std::slice::from_ref(&r));
    let fail = |what: String| Err(format!("{}: {what}\n{table}", s.name));
    let windows = r.sluice.len();
    let Some(b) = bounds(s.name) else {
        return fail(format!("no bounds for scenario {:?}", s.name));
    };
    for i in 0..windows {
        if r.sluice_false_denials(i) > MAX_FALSE_DENIALS {
            return fail(format!(
                "window {}: false denials {:.3}",
                i + 1,
                r.sluice_false_denials(i)
            ));
        }
    }
    // Both bounds, in every scenario: where the demand is at least 1.5× what the exact
    // limiter admits, the fleet admits at least 0.90× of it (it keeps within the upper bound
    // by sharing, not by denying).
    for i in 0..windows {
        let offered = r.sluice[i].offered as f64 / r.reference(i) as f64;
        if offered >= 1.5 && r.sluice_admitted(i) < MIN_ADMITTED {
            return fail(format!(
                "window {}: offered {offered:.2}×, admitted only {:.3}× of what the exact limiter admits",
                i + 1,
                r.sluice_admitted(i)
            ));
        }
    }
    for &(from, max) in b.at_most {
        for i in from..windows {
            if r.sluice_admitted(i) > max {
                return Err(format!(
                    "{}: window {} admitted {:.3}× the limit, bound {max}\n{table}",
                    s.name,
                    i + 1,
                    r.sluice_admitted(i)
                ));
            }
        }
    }
    match b.at_least {
        Some(Floor::Window { window, min, what }) if r.sluice_admitted(window) < min => {
            return fail(format!("{what} {:.3}×", r.sluice_admitted(window)));
        }
        Some(Floor::EveryPeriod(min)) => {
            for i in 0..windows {
                if r.sluice_admitted(i) < min {
                    return fail(format!(
                        "period {} admitted only {:.3}× the exact bucket",
                        i + 1,
                        r.sluice_admitted(i)
                    ));
                }
            }
        }
        _ => {}
    }
    match b.plain_at_least {
        Some(min) if r.baseline_admitted(0) < min => fail(format!(
            "plain design admitted only {:.2}×",
            r.baseline_admitted(0)
        )),
        _ => Ok(()),
    }
}

#[test]
fn every_scenario_stays_within_its_bounds() {
    for s in scenarios() {
        if let Err(e) = check(&s) {
            panic!("{e}");
        }
    }
}

#[test]
fn the_bounds_hold_on_other_seeds() {
    let mut failures = Vec::new();
    for k in 1..=5u64 {
        for s in scenarios() {
            // (The bursty-human buckets draw their bursts anew from the seed too.)
            let mut s = s.reseeded(s.seed.wrapping_mul(0x9e37_79b9).wrapping_add(k));
            // Three windows hold every bound (cold start, steady state, an outage and the
            // window after it) and keep this test a few seconds shorter: each run drives the
            // whole fleet's request path and sync tasks.
            s.windows = s.windows.min(3);
            if let Err(e) = check(&s) {
                failures.push(format!("seed {:#x}: {e}", s.seed));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A rule's default configuration: every sliding-window scenario again with `strict` on
/// (denied hits count too), on the named seed and five others, over its first two windows
/// (the cold start, and the window of an outage, a restart or a departure). Under their
/// sustained overload a strict window admits nothing past the first, for the exact limiter
/// too (the reference counts denied hits as sluice does, `sim/exact.rs`), so what is held
/// here is the targets' over-admission (1.10×) and false denials (2 %) in every window, and
/// a first window that admits the limit (at least 0.95× of what was offered, up to the
/// limit). Measured on the six seeds: at most 1.091× (the bursts at 20 and 50 replicas; the
/// 2-replica surges 1.015–1.047, the slow surges 1.000–1.002, the start together
/// 1.032–1.048, the join mid-surge 1.003–1.068), false denials at most 1.8 % (the burst at
/// 50 replicas; the join mid-surge 1.2 %).
#[test]
fn every_sliding_scenario_stays_within_the_targets_with_strict_on() {
    use sluice::core::Algorithm;
    let mut failures = Vec::new();
    for s in scenarios() {
        if s.limit.algorithm != Algorithm::SlidingWindow || s.strict {
            continue;
        }
        for k in 0..6u64 {
            let seed = match k {
                0 => s.seed,
                k => s.seed.wrapping_mul(0x9e37_79b9).wrapping_add(k),
            };
            let mut s = Scenario {
                strict: true,
                ..s.reseeded(seed)
            };
            s.windows = s.windows.min(2);
            let r = run(&s);
            let table = render_table(std::slice::from_ref(&r));
            for i in 0..r.sluice.len() {
                let (admitted, denied) = (r.sluice_admitted(i), r.sluice_false_denials(i));
                if admitted > 1.10 || denied > MAX_FALSE_DENIALS {
                    failures.push(format!(
                        "{} (seed {seed:#x}), window {}:\n{table}",
                        s.name,
                        i + 1
                    ));
                }
            }
            let w = &r.sluice[0];
            let least = STRICT_FLOOR * w.offered.min(u64::from(r.limit)) as f64;
            if (w.admitted as f64) < least {
                failures.push(format!(
                    "{} (seed {seed:#x}) admitted too little:\n{table}",
                    s.name
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_table_is_what_sluice_simulate_prints() {
    let out = sluice::sim::run_all();
    for s in scenarios() {
        assert_eq!(
            out.matches(&format!("| {} |", s.name)).count(),
            s.windows as usize,
            "{out}"
        );
    }
}

#[test]
fn bursts_on_limits_of_400_per_extra_replica_keep_false_denials_within_2_percent() {
    // The bursts' false denials on the prior shrink as `sqrt((N − 1) / limit)`, and the
    // spread a node may take above its even share of the room as `sqrt(room / N)`
    // (`core/prior.rs`): on a limit of 400 × (N − 1) the same 20- and 50-replica bursts meet
    // the target, and admit less over the limit than on 1,000. Measured 0.2–0.4 % and
    // 0.3–0.4 % over three seeds, at 1.043–1.048× the limit (with a slack of 1.3 and no
    // spread, 0–0.5 % at 1.074–1.080×; on the prior alone 0.3–0.8 % and 0.2–0.5 % at
    // 1.048–1.050×).
    for (name, rpu) in [
        ("burst 10x, 20 nodes", 7_600),
        ("burst 10x, 50 nodes", 19_600),
    ] {
        for k in 0..3 {
            let mut s = scenarios().into_iter().find(|s| s.name == name).unwrap();
            s.limit.requests_per_unit = rpu;
            s.seed = s.seed.wrapping_add(k);
            let r = run(&s);
            let (admitted, denied) = (r.sluice_admitted(0), r.sluice_false_denials(0));
            assert!(
                admitted <= 1.06 && denied <= MAX_FALSE_DENIALS,
                "{name}, {rpu}: {admitted:.3}, {denied:.4}"
            );
        }
    }
}

/// The bucket scenarios over the six seeds the bounds are checked on (the named seed and
/// the five of [`the_bounds_hold_on_other_seeds`]), or over `SEEDS` seeds when set: the worst
/// period of each run, as docs/accuracy.md's bucket table shows them, and how many runs went past
/// 1.10× the exact bucket or 2 % false denials. Run with
/// `cargo test --test in_process -- --ignored --nocapture simulate::bucket_ranges`.
#[test]
#[ignore = "prints docs/accuracy.md's bucket ranges; the bounds are checked by the other tests"]
fn bucket_ranges() {
    let seeds: u64 = std::env::var("SEEDS").map_or(6, |v| v.parse().expect("SEEDS: a number"));
    println!("| bucket scenario | sluice/exact | false denials | runs past 1.10× / 2 % |");
    println!("| --- | ---: | ---: | ---: |");
    for s in scenarios()
        .into_iter()
        .filter(|s| s.name.starts_with("bucket "))
    {
        let runs = std::iter::once(s.clone()).chain((1..seeds).map(|k| {
            let mut r = s.reseeded(s.seed.wrapping_mul(0x9e37_79b9).wrapping_add(k));
            r.windows = r.windows.min(3);
            r
        }));
        let (mut admitted, mut denied) = (Vec::new(), Vec::new());
        for r in runs.map(|r| run(&r)) {
            let n = r.sluice.len();
            admitted.push((0..n).map(|i| r.sluice_admitted(i)).fold(0.0, f64::max));
            denied.push(
                (0..n)
                    .map(|i| r.sluice_false_denials(i))
                    .fold(0.0, f64::max),
            );
        }
        let range = |v: &[f64]| {
            let lo = v.iter().copied().fold(f64::MAX, f64::min);
            let hi = v.iter().copied().fold(0.0, f64::max);
            (lo, hi)
        };
        let past = |v: &[f64], bound: f64| v.iter().filter(|&&x| x > bound).count();
        let ((a0, a1), (d0, d1)) = (range(&admitted), range(&denied));
        println!(
            "| {} | {a0:.3}–{a1:.3} | {:.1}–{:.1} % | {} / {} of {seeds} |",
            s.name.trim_start_matches("bucket "),
            d0 * 100.0,
            d1 * 100.0,
            past(&admitted, 1.10),
            past(&denied, MAX_FALSE_DENIALS),
        );
    }
}
