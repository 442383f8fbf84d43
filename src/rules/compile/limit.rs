//! One limit (a `rate_limit` block or an `additional_limits` entry) checked and compiled into
//! a [`LimitSpec`]: unit, count, window, algorithm and `strict`.

use super::Compiler;
use crate::core::{Algorithm, Limit};
use crate::rules::locate::Step;
use crate::rules::model::LimitConfig;
use crate::rules::{LimitSpec, Unit};

/// The longest window a limit may have: 10 years of 365 days, 3.2e11 ms (under 2^39).
///
/// Windows are counted in u64 milliseconds here and, in global mode, in the Redis script,
/// where Lua numbers are doubles, exact only up to 2^53. The arithmetic done on a window is
/// `2 × window_ms` (the key's TTL) and `epoch × window_ms` with `epoch = now_ms / window_ms`
/// (a window start, at most `now_ms + window_ms`). With `now_ms` under 2^42 (until the year
/// 2109) and the window under 2^39, every such value stays under 2^43: exact in a double and
/// far from u64's end. Ten years also keeps errors readable and is longer than any useful
/// rate limit.
pub const MAX_WINDOW_MS: u64 = 10 * 365 * 86_400_000;

// The bound above, checked where it is stated: a window start plus a TTL stays exact.
const _: () = assert!(MAX_WINDOW_MS < 1 << 39 && 2 * MAX_WINDOW_MS + (1 << 42) < 1 << 53);

impl Compiler<'_> {
    /// One limit, written at `at` below the current descriptor (`rate_limit`, or an entry of
    /// `additional_limits`).
    pub(super) fn limit(
        &mut self,
        l: &LimitConfig,
        composite: &str,
        at: &[Step],
    ) -> Option<LimitSpec> {
        let (unit, requests_per_unit) = self.unit_and_count(l, composite, at)?;
        let window_ms = self.window(l, unit, composite, at)?;
        let algorithm = self.algorithm(l, requests_per_unit, window_ms, composite, at)?;
        let bucket = matches!(algorithm, Algorithm::TokenBucket { .. });
        if algorithm == Algorithm::Concurrency && l.strict == Some(true) {
            // Envoy releases only what it admitted: a denied acquisition counted would hold
            // its place until it lapsed.
            self.error_at(
                &at_key(at, "strict"),
                format!("{composite}: strict cannot be used with algorithm: concurrency (a denied acquisition is never released)"),
            );
            return None;
        }
        Some(LimitSpec {
            limit: Limit {
                requests_per_unit,
                window_ms,
                algorithm,
            },
            unit,
            // Buckets are lenient unless told: a denied request takes no token. Concurrency
            // limits always are.
            strict: l
                .strict
                .unwrap_or(!bucket && algorithm != Algorithm::Concurrency),
        })
    }

    /// The limit's unit and count, both checked (and both reported when both are wrong).
    fn unit_and_count(
        &mut self,
        l: &LimitConfig,
        composite: &str,
        at: &[Step],
    ) -> Option<(Unit, u32)> {
        let unit = Unit::parse(&l.unit);
        if unit.is_none() {
            self.error_at(
                &at_key(at, "unit"),
                format!(
                    "invalid rate limit unit '{}' (valid: {})",
                    l.unit,
                    Unit::VALID.join(", ")
                ),
            );
        }
        // The reference reads a missing count as 0, a limit that denies every request: a
        // slip (a key one level too far out, a typo), never what was meant. An explicit 0
        // still says "deny everything".
        if l.requests_per_unit.is_none() {
            let (block, whole) = match at {
                [Step::Key("rate_limit")] => {
                    ("rate_limit", vec![Step::KeyItself("rate_limit".into())])
                }
                [Step::Key("overrides"), ..] => ("override", at.to_vec()),
                _ => ("additional_limits entry", at.to_vec()),
            };
            self.error_at(
                &whole,
                format!(
                    "{block} of '{composite}' has no requests_per_unit (say `unlimited: true` for no limit, or `requests_per_unit: 0` to deny every request)"
                ),
            );
        }
        Some((unit?, l.requests_per_unit?))
    }

    /// The window in milliseconds: `unit_multiplier` units, at least one and at most
    /// [`MAX_WINDOW_MS`].
    fn window(&mut self, l: &LimitConfig, unit: Unit, composite: &str, at: &[Step]) -> Option<u64> {
        let multiplier = l.unit_multiplier.unwrap_or(1);
        if multiplier == 0 {
            self.error_at(
                &at_key(at, "unit_multiplier"),
                "unit_multiplier must be at least 1",
            );
            return None;
        }
        let window_ms = (unit.seconds() * 1000)
            .checked_mul(u64::from(multiplier))
            .filter(|ms| *ms <= MAX_WINDOW_MS);
        if window_ms.is_none() {
            self.error_at(
                &at_key(at, "unit_multiplier"),
                format!(
                    "{composite}: window of {multiplier} {}s is too long (at most {} days, 10 years)",
                    unit.name().to_ascii_lowercase(),
                    MAX_WINDOW_MS / 86_400_000,
                ),
            );
        }
        window_ms
    }

    /// The algorithm, with the keys only a token bucket takes (`burst`) and its bound on
    /// the refill rate checked. `concurrency`: `requests_per_unit` acquisitions in flight,
    /// each lapsing one to two windows (the lease) after it was made.
    fn algorithm(
        &mut self,
        l: &LimitConfig,
        requests_per_unit: u32,
        window_ms: u64,
        composite: &str,
        at: &[Step],
    ) -> Option<Algorithm> {
        let algorithm = match l.algorithm.as_deref() {
            None => self.default_algorithm,
            Some("sliding_window") => Algorithm::SlidingWindow,
            Some("fixed_window") => Algorithm::FixedWindow,
            Some("token_bucket") => Algorithm::TokenBucket {
                burst: l.burst.unwrap_or(requests_per_unit),
            },
            Some("concurrency") => Algorithm::Concurrency,
            Some(other) => {
                self.error_at(
                    &at_key(at, "algorithm"),
                    format!(
                        "invalid algorithm '{other}' (expected sliding_window, fixed_window, token_bucket or concurrency)"
                    ),
                );
                return None;
            }
        };
        let bucket = matches!(algorithm, Algorithm::TokenBucket { .. });
        if l.burst.is_some() && !bucket {
            self.error_at(
                &at_key(at, "burst"),
                format!("{composite}: burst needs algorithm: token_bucket"),
            );
            return None;
        }
        // A token takes at least a nanosecond to refill (`core/bucket/`).
        if bucket && u64::from(requests_per_unit) * 1000 > window_ms * MAX_BUCKET_RATE {
            self.error_at(
                &at_key(at, "requests_per_unit"),
                format!(
                    "{composite}: a token bucket refills at most {MAX_BUCKET_RATE} tokens a second"
                ),
            );
            return None;
        }
        Some(algorithm)
    }
}

/// The steps from the current descriptor to the key `key` of the limit at `at`.
fn at_key(at: &[Step], key: &str) -> Vec<Step> {
    let mut steps = at.to_vec();
    steps.push(Step::KeyItself(key.to_string()));
    steps
}

/// The fastest refill a token bucket may have, per second: one token per nanosecond.
const MAX_BUCKET_RATE: u64 = 1_000_000_000;
