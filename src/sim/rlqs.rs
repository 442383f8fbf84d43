//! The quota service (RLQS) under simulation, behind `sluice simulate --rlqs`: simulated
//! Envoys (`envoy.rs`, Envoy 1.40's `rate_limit_quota` filter) each holding one stream to one
//! replica, the replicas being the production code.
//!
//! Each replica is what `fleet.rs` starts for the window scenarios (a `RateLimiter` in global
//! mode, `global::spawn`'s sync task over the simulated store) plus the quota service's
//! [`Quotas`] on that limiter, handed to global mode for its presence loop (the fleet's
//! streams and demand per counter, once a tick through the store) as the service's wiring
//! hands it. Each Envoy's stream is a production [`Stream`] of its replica's `Quotas`, driven as
//! `server/rlqs.rs` drives it: a task that takes the reports as they arrive and calls
//! `refresh` every [`REFRESH`] and when the stream asks (`Stream::wake_at`), sending back
//! what either returns. Messages between an Envoy and sluice take [`LATENCY_MS`] each way, in
//! order. Each Envoy reports its bucket every `report_ms` (5 s, Envoy 1.40's hard-coded
//! cadence, or 1 s) at its own seeded phase, and a new bucket at once. The traffic is seeded,
//! the time tokio's paused clock: the same scenario gives the same report on every machine.
//!
//! Measured per window (a token bucket's: per period of ten fill times), against the exact
//! references of `exact.rs` (the window formula over the fleet's true admitted hits; an
//! exact bucket): admitted over the limit (over the exact bucket's admitted), and false
//! denials (hits denied that
//! the exact limiter would have admitted, each free slot once). For a scenario where an Envoy
//! goes idle, the reporting intervals until the others use its share (`reuse`): until the
//! token buckets the other Envoys run add up to 90 % of the limit's rate, sampled every
//! [`SAMPLE_MS`]. (Their admitted hits would say the same with the noise of a few hits a
//! second: at 10 a second, one second of the steady state admits from 4 to 14.)

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use parking_lot::Mutex;
use prost::Message;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::{interval_at, sleep_until, Instant, MissedTickBehavior};

use super::envoy::{Filter, Usage};
use super::exact::Exact;
use super::fleet::{Fleet, SimClock};
use super::store::SimStore;
use super::traffic::{phases, SplitMix64};
use super::{aligned_t0, period_ms, windows, Scenario, WindowStats};
use crate::core::clock::UnixMillis;
use crate::core::{Algorithm, Limit};
use crate::rlqs::{Config, Quotas, Stream, REFRESH};

/// One way between an Envoy and its replica, in ms.
pub const LATENCY_MS: u64 = 2;

/// How often the other Envoys' token buckets are looked at after an Envoy goes idle.
pub const SAMPLE_MS: u64 = 100;

/// The replicas' sync tick (the production default) and their round trip to the store.
const TICK_MS: u64 = 1000;
const RTT_MS: u64 = 2;

/// Traffic during one stretch of a quota scenario: hits evenly spaced in time, each to an
/// Envoy of `envoys` drawn by the seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Flow {
    /// When it starts, in ms from the start of the run.
    pub from_ms: u64,
    /// When it ends (exclusive).
    pub until_ms: u64,
    /// Offered hits per window, as a multiple of the limit.
    pub times_limit: f64,
    /// The Envoys it goes to: `first..end`.
    pub envoys: (usize, usize),
    /// The first of them takes this share of the hits, the others the rest evenly; `None`:
    /// every hit goes to one drawn evenly.
    pub hot_share: Option<f64>,
}

/// One simulated quota situation: Envoys on replicas, one bucket, traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct RlqsScenario {
    /// Short name, shown in the table.
    pub name: &'static str,
    /// Envoys; Envoy `e` holds its stream to replica `e % replicas`.
    pub envoys: usize,
    /// Replicas of sluice.
    pub replicas: usize,
    /// The rule's limit on the one bucket.
    pub limit: Limit,
    /// How often each Envoy reports, in ms.
    pub report_ms: u64,
    /// The traffic.
    pub flows: Vec<Flow>,
    /// When Envoy 0 goes idle (ms from the start), its demand moving to the others: the run
    /// measures how many reporting intervals pass until they use its share.
    pub idle_at_ms: Option<u64>,
    /// When the last Envoy starts getting requests (ms from the start; its flows say so): the
    /// run measures the rate of its first assignment and two reporting intervals later.
    pub join_at_ms: Option<u64>,
    /// How many windows are run and reported.
    pub windows: u64,
    /// Seed of the traffic and of the phases.
    pub seed: u64,
}

impl RlqsScenario {
    /// The same scenario on another seed.
    pub fn reseeded(&self, seed: u64) -> RlqsScenario {
        RlqsScenario {
            seed,
            ..self.clone()
        }
    }

    /// Whether the offered hits stay under the limit in every window: where false denials
    /// are the measure of the sharing (at the limit, the exact limiter denies too).
    pub fn under_limit(&self) -> bool {
        self.flows.iter().map(|f| f.times_limit).sum::<f64>() < 1.0
    }

    /// The window scenario the exact reference and the fleet are built for: the replicas,
    /// the limit (`strict: false`: Envoy denies locally, and sluice counts only admitted
    /// hits), the windows, the seed.
    fn fleet(&self) -> Scenario {
        Scenario {
            name: self.name,
            nodes: self.replicas,
            limit: self.limit,
            windows: self.windows,
            seed: self.seed,
            strict: false,
            tick_ms: TICK_MS,
            rtt_ms: RTT_MS,
            t0: aligned_t0(self.limit.window_ms),
            ..windows::base()
        }
    }
}

/// The outcome of one quota scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct RlqsReport {
    /// The scenario's name.
    pub scenario: &'static str,
    /// Envoys and replicas.
    pub envoys: usize,
    /// See `envoys`.
    pub replicas: usize,
    /// Each Envoy's report interval, ms.
    pub report_ms: u64,
    /// The limit per window (a bucket's refill per window).
    pub limit: u32,
    /// The rule's algorithm, for the table: `sliding`, `fixed`, `bucket` (or `concurrency`).
    pub rule: &'static str,
    /// The limit's window (ms): a bucket refills `limit` per window.
    pub window_ms: u64,
    /// The reported period (ms): the window, or a bucket's ten fill times (`sim::period_ms`).
    pub period_ms: u64,
    /// Whether the offered hits stay under the limit.
    pub under_limit: bool,
    /// Window by window (a bucket's: period by period).
    pub windows: Vec<WindowStats>,
    /// Hits the fleet admitted, second by second.
    pub admitted_per_s: Vec<u64>,
    /// Hits each Envoy admitted after the first period (once the shares settled), and hits
    /// offered to it then: the fairness between Envoys of equal demand.
    pub per_envoy: Vec<(u64, u64)>,
    /// Reporting intervals from Envoy 0 going idle until the others use its share (until the
    /// token buckets they run add up to 90 % of the limit's rate); `Some(None)` when that
    /// never happened in the run.
    pub reuse: Option<Option<u32>>,
    /// The joining Envoy's token bucket rate as a share of the limit's rate: its first one,
    /// and two reporting intervals after that one arrived; `None` without a join in the run.
    pub join: Option<(f64, f64)>,
}

impl RlqsReport {
    /// Admitted hits in window `i` over its reference ([`RlqsReport::reference`]).
    pub fn admitted(&self, i: usize) -> f64 {
        self.windows[i].admitted as f64 / self.reference(i) as f64
    }

    /// False denials in window `i` over its reference.
    pub fn false_denials(&self, i: usize) -> f64 {
        self.windows[i].false_denials as f64 / self.reference(i) as f64
    }

    /// What the exact limiter fed the same arrivals admits in window `i`: an exact bucket's
    /// admitted hits, or the offered hits up to the window's limit (at least 1).
    pub fn expected(&self, i: usize) -> u64 {
        match self.rule {
            "bucket" => self.windows[i].exact_admitted.max(1),
            _ => self.windows[i].offered.min(u64::from(self.limit)).max(1),
        }
    }

    /// Offered hits in window `i` over the limit in a period (a bucket's refill in one).
    pub fn offered(&self, i: usize) -> f64 {
        let per_period =
            f64::from(self.limit) * self.period_ms as f64 / self.window_ms.max(1) as f64;
        self.windows[i].offered as f64 / per_period.max(1.0)
    }

    /// What window `i` is measured against, as the window scenarios measure it: the limit, or
    /// what an exact bucket fed the same arrivals admitted in the period (at least 1).
    pub fn reference(&self, i: usize) -> u64 {
        match self.rule {
            "bucket" => self.windows[i].exact_admitted.max(1),
            _ => u64::from(self.limit.max(1)),
        }
    }
}

/// Every hit of the run as (ms from the start, Envoy), in time order.
fn arrivals(s: &RlqsScenario) -> Vec<(u64, usize)> {
    let mut rng = SplitMix64(s.seed);
    let mut out = Vec::new();
    for flow in &s.flows {
        let per_ms =
            flow.times_limit * f64::from(s.limit.requests_per_unit) / s.limit.window_ms as f64;
        let (first, end) = flow.envoys;
        if per_ms <= 0.0 || end <= first {
            continue;
        }
        let n = (end - first) as u64;
        let count = (flow.until_ms.saturating_sub(flow.from_ms) as f64 * per_ms) as u64;
        for k in 0..count {
            let t = flow.from_ms + (k as f64 / per_ms) as u64;
            let envoy = match flow.hot_share {
                Some(share) if n > 1 => {
                    if rng.unit() < share {
                        first
                    } else {
                        first + 1 + (rng.next() % (n - 1)) as usize
                    }
                }
                _ => first + (rng.next() % n) as usize,
            };
            out.push((t, envoy));
        }
    }
    out.sort_by_key(|&(t, _)| t);
    out
}

/// Runs one quota scenario on a fresh paused-time runtime.
///
/// # Panics
/// When called inside a tokio runtime, or with no replica.
pub fn run(s: &RlqsScenario) -> RlqsReport {
    assert!(s.replicas > 0, "a quota scenario needs a replica");
    let fleet_scenario = s.fleet();
    let arrivals = arrivals(s);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let (windows, admitted_per_s, per_envoy, reuse, join) = runtime.block_on(async {
        let zero = Instant::now() + Duration::from_millis(2 * TICK_MS);
        let clock = SimClock {
            t0: UnixMillis(fleet_scenario.t0),
            zero,
        };
        let store = Arc::new(SimStore::new(RTT_MS, None, None, zero));
        let phases = phases(&fleet_scenario);
        // Each replica's quota service handed to its global mode, as the service's wiring
        // hands it.
        let fleet = Fleet::start_serving_quotas(
            &s.limit,
            TICK_MS,
            clock,
            &store,
            &phases,
            Config::default(),
        )
        .await;
        let quotas: Vec<Arc<Quotas>> = (0..s.replicas).map(|r| fleet.quotas(r).clone()).collect();
        let mut rng = SplitMix64(s.seed ^ 0x726c_7173);
        let envoys: Vec<Envoy> = (0..s.envoys)
            .map(|e| {
                let report_phase = rng.next() % s.report_ms.max(1);
                let refresh_phase = rng.next() % REFRESH.as_millis() as u64;
                Envoy::connect(
                    &quotas[e % s.replicas],
                    zero,
                    (report_phase, s.report_ms),
                    refresh_phase,
                )
            })
            .collect();
        let filters: Vec<Arc<Mutex<Filter>>> = envoys.iter().map(|e| e.filter.clone()).collect();
        // The others than Envoy 0 after it goes idle; the last one after it joins.
        let others = s
            .idle_at_ms
            .map(|at| sample(s, filters[1..].to_vec(), zero, at));
        let joiner = s
            .join_at_ms
            .map(|at| sample(s, filters[s.envoys - 1..].to_vec(), zero, at));
        let (windows, per_s, per_envoy) = drive(s, &fleet_scenario, &arrivals, &envoys, zero).await;
        let reuse = others.map(|rates| reuse_intervals(&rates.lock(), s));
        let join = joiner.and_then(|rates| join_shares(&rates.lock(), s));
        (windows, per_s, per_envoy, reuse, join)
    });
    RlqsReport {
        scenario: s.name,
        envoys: s.envoys,
        replicas: s.replicas,
        report_ms: s.report_ms,
        limit: s.limit.requests_per_unit,
        rule: match s.limit.algorithm {
            Algorithm::SlidingWindow => "sliding",
            Algorithm::FixedWindow => "fixed",
            Algorithm::TokenBucket { .. } => "bucket",
            Algorithm::Concurrency => "concurrency",
        },
        window_ms: s.limit.window_ms,
        period_ms: period_ms(&fleet_scenario),
        under_limit: s.under_limit(),
        windows,
        admitted_per_s,
        per_envoy,
        reuse,
        join,
    }
    // Dropping the runtime dropped every task: nothing after the last window is measured.
}

/// Hands each arrival to its Envoy at its time; the per-window stats, the admitted hits
/// per second, and each Envoy's (admitted, offered) after the first period.
async fn drive(
    s: &RlqsScenario,
    fleet: &Scenario,
    arrivals: &[(u64, usize)],
    envoys: &[Envoy],
    zero: Instant,
) -> (Vec<WindowStats>, Vec<u64>, Vec<(u64, u64)>) {
    let period = period_ms(fleet);
    let end = s.windows * period;
    let mut exact = Exact::new(fleet);
    let mut per_s = vec![0u64; end.div_ceil(1000) as usize];
    let mut per_envoy = vec![(0u64, 0u64); envoys.len()];
    for &(t, e) in arrivals.iter().take_while(|&&(t, _)| t < end) {
        let at = zero + Duration::from_millis(t);
        if Instant::now() < at {
            sleep_until(at).await;
        }
        let envoy = &envoys[e];
        let (admitted, first) = envoy.filter.lock().request(t);
        if let Some(usage) = first {
            envoy.to_sluice.send(usage_reports(usage));
        }
        exact.record(t, admitted);
        if admitted {
            per_s[(t / 1000) as usize] += 1;
        }
        if t >= period {
            per_envoy[e].0 += u64::from(admitted);
            per_envoy[e].1 += 1;
        }
    }
    sleep_until(zero + Duration::from_millis(end)).await;
    (exact.stats, per_s, per_envoy)
}

/// Samples, every [`SAMPLE_MS`] from `from_ms` to the end of the run, the rate of the token
/// buckets `filters` run together (a blanket rule, or no assignment, counts as none).
fn sample(
    s: &RlqsScenario,
    filters: Vec<Arc<Mutex<Filter>>>,
    zero: Instant,
    from_ms: u64,
) -> Arc<Mutex<Vec<f64>>> {
    let rates = Arc::new(Mutex::new(Vec::new()));
    let end = s.windows * period_ms(&s.fleet());
    let out = rates.clone();
    tokio::spawn(async move {
        let mut t = from_ms;
        while t < end {
            sleep_until(zero + Duration::from_millis(t)).await;
            // A fold from +0.0: an empty `sum` of floats is -0.0.
            let sum = filters
                .iter()
                .filter_map(|f| f.lock().tokens(t))
                .fold(0.0, |sum, (rate, _)| sum + rate);
            out.lock().push(sum);
            t += SAMPLE_MS;
        }
    });
    rates
}

/// The joining Envoy's sampled rate (`rates`, one every [`SAMPLE_MS`] from its join) as a
/// share of the limit's rate: its first token bucket's, and two reporting intervals after
/// that one arrived (0 and 0 if none ever did); `None` when the run ended before the join.
fn join_shares(rates: &[f64], s: &RlqsScenario) -> Option<(f64, f64)> {
    if rates.is_empty() {
        return None;
    }
    let rate = limit_rate(&s.limit);
    let Some(first) = rates.iter().position(|&r| r > 0.0) else {
        return Some((0.0, 0.0));
    };
    let later = first + (2 * s.report_ms / SAMPLE_MS) as usize;
    let at = |i: usize| rates.get(i).copied().unwrap_or(0.0) / rate;
    Some((at(first), at(later)))
}

/// A limit's steady rate, a second.
fn limit_rate(limit: &Limit) -> f64 {
    f64::from(limit.requests_per_unit) * 1000.0 / limit.window_ms.max(1) as f64
}

/// The reporting intervals from the idle moment until the others' sampled rate (`rates`,
/// one every [`SAMPLE_MS`]) first reached 90 % of the limit's rate (at least 1); `None` if it
/// never did.
pub fn reuse_intervals(rates: &[f64], s: &RlqsScenario) -> Option<u32> {
    let rate = limit_rate(&s.limit);
    let k = rates.iter().position(|&r| r >= 0.9 * rate)? as u64;
    let elapsed_ms = k * SAMPLE_MS;
    Some(elapsed_ms.div_ceil(s.report_ms.max(1)).max(1) as u32)
}

/// One simulated Envoy: its filter and its side of the stream.
struct Envoy {
    filter: Arc<Mutex<Filter>>,
    to_sluice: Link<RateLimitQuotaUsageReports>,
}

impl Envoy {
    /// An Envoy whose stream is served by `quotas`: the stream's task (its first refresh
    /// `refresh_phase` ms after `zero`), the Envoy's report timer (`report` = (phase,
    /// interval) in ms), and the delivery of sluice's actions to the filter.
    fn connect(
        quotas: &Arc<Quotas>,
        zero: Instant,
        report: (u64, u64),
        refresh_phase: u64,
    ) -> Envoy {
        let filter = Arc::new(Mutex::new(Filter::default()));
        let (to_sluice, reports) = link();
        let (to_envoy, mut actions) = link::<Vec<BucketAction>>();
        let first_refresh = zero + Duration::from_millis(refresh_phase);
        tokio::spawn(serve(quotas.clone(), reports, to_envoy, first_refresh));
        let f = filter.clone();
        tokio::spawn(async move {
            while let Some(a) = actions.recv().await {
                f.lock().apply(&a, ms_since(zero));
            }
        });
        let (f, tx) = (filter.clone(), to_sluice.clone());
        let (phase, every) = report;
        tokio::spawn(async move {
            let every = Duration::from_millis(every.max(1));
            let mut timer = interval_at(zero + Duration::from_millis(phase), every);
            loop {
                timer.tick().await;
                let usage = f.lock().report(ms_since(zero));
                if let Some(u) = usage {
                    tx.send(usage_reports(u));
                }
            }
        });
        Envoy { filter, to_sluice }
    }
}

/// A stream's task, as `server/rlqs.rs` runs it: reports as they come, a refresh every
/// [`REFRESH`] and at the stream's `wake_at`, the actions either returns sent back.
async fn serve(
    quotas: Arc<Quotas>,
    mut reports: UnboundedReceiver<RateLimitQuotaUsageReports>,
    to_envoy: Link<Vec<BucketAction>>,
    first_refresh: Instant,
) {
    let mut stream = Stream::open(&quotas).expect("within the stream bound");
    let mut refresh = interval_at(first_refresh, REFRESH);
    refresh.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let wake = stream.wake_at().map(|at| {
            let now = quotas.limiter().now();
            Instant::now() + Duration::from_millis(at.0.saturating_sub(now.0))
        });
        let actions = tokio::select! {
            // Biased: the same order on every run.
            biased;
            msg = reports.recv() => match msg {
                Some(m) => stream
                    .report(&m.encode_to_vec(), quotas.limiter().now())
                    .expect("the simulated Envoy's reports are valid"),
                None => break,
            },
            _ = refresh.tick() => stream.refresh(quotas.limiter().now()),
            () = woken(wake) => stream.refresh(quotas.limiter().now()),
        };
        if !actions.is_empty() {
            to_envoy.send(actions.to_proto());
        }
    }
}

/// Sleeps until `at`, or for ever without it (`Stream::wake_at`).
async fn woken(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Milliseconds of simulated time since `zero` (0 before it).
fn ms_since(zero: Instant) -> u64 {
    Instant::now().saturating_duration_since(zero).as_millis() as u64
}

/// The report message carrying one usage of the scenarios' bucket (`k=e` of domain `sim`,
/// the rule `fleet::rules_yaml` writes), its `time_elapsed` in whole seconds as Envoy's
/// filter sends it (`duration_cast<seconds>` of the time since the bucket's last report): a
/// bucket's first periodic report, less than a second after its creation, says 0 too.
fn usage_reports(u: Usage) -> RateLimitQuotaUsageReports {
    let bucket = [("k".to_string(), "e".to_string())].into_iter().collect();
    RateLimitQuotaUsageReports {
        domain: "sim".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId { bucket }),
            // Whole seconds, rounded down, as Envoy's filter fills it in.
            time_elapsed: Some(PbDuration {
                seconds: (u.elapsed_ms / 1000) as i64,
                nanos: 0,
            }),
            num_requests_allowed: u.allowed,
            num_requests_denied: u.denied,
        }],
    }
}

/// One direction of a stream: messages delivered [`LATENCY_MS`] after they are sent, in
/// the order sent.
struct Link<T> {
    tx: UnboundedSender<(Instant, T)>,
}

impl<T> Clone for Link<T> {
    fn clone(&self) -> Self {
        Link {
            tx: self.tx.clone(),
        }
    }
}

impl<T> Link<T> {
    fn send(&self, msg: T) {
        let at = Instant::now() + Duration::from_millis(LATENCY_MS);
        // The other side is gone only when the run ends.
        let _ = self.tx.send((at, msg));
    }
}

/// A link and the receiver its messages come out of, each at its time.
fn link<T: Send + 'static>() -> (Link<T>, UnboundedReceiver<T>) {
    let (tx, mut sent) = unbounded_channel::<(Instant, T)>();
    let (out, rx) = unbounded_channel();
    tokio::spawn(async move {
        while let Some((at, msg)) = sent.recv().await {
            sleep_until(at).await;
            if out.send(msg).is_err() {
                break;
            }
        }
    });
    (Link { tx }, rx)
}
