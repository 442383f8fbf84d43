#!/usr/bin/env bash
# Coverage-guided fuzzing on stable Rust with AFL++ (cargo-afl): builds the targets in fuzz/
# and runs each for a bounded time, then replays every crashing input it has found.
#
#   scripts/fuzz.sh [TARGET|all] [SECONDS]     # default: all targets, 60 s each
#
# Targets: rules (rules YAML -> RuleSet or errors), matcher (RuleSet::find), json (proto3
# JSON -> RateLimiter::should_rate_limit), rlqs (a quota usage report's bytes -> rlqs::check,
# held to prost's decoding); see fuzz/src/lib.rs. Installs what is missing:
# clang/llvm (apt-get, for AFL++'s runtime), cargo-afl (cargo install) and AFL++ itself
# (`cargo afl config --build`). Findings accumulate in fuzz/out/TARGET/default/ (ignored by
# git) and a later run resumes from there.
#
# Exit status: 0 when no input in fuzz/out/*/default/crashes* still makes its target panic;
# 1 otherwise (or when afl-fuzz itself fails), after listing each such file (copy it to fuzz/regressions/TARGET/ once fixed,
# so `cargo test --test in_process fuzz_regressions::` replays it on every CI run). Hangs (inputs slower
# than AFL's timeout) are listed but do not fail the run.
set -euo pipefail
cd "$(dirname "$0")/.."

all_targets=(rules matcher json rlqs)
target=${1:-all}
seconds=${2:-60}
if [ "$target" = all ]; then
  targets=("${all_targets[@]}")
elif [[ " ${all_targets[*]} " == *" $target "* ]]; then
  targets=("$target")
else
  echo "unknown target '$target'; one of: ${all_targets[*]} all" >&2
  exit 2
fi
[[ "$seconds" =~ ^[0-9]+$ ]] && [ "$seconds" -gt 0 ] || { echo "SECONDS must be a positive integer" >&2; exit 2; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if ! command -v clang >/dev/null || ! command -v llvm-config >/dev/null; then
  echo "== installing clang and llvm"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq clang llvm >/dev/null
fi
if ! cargo afl --version >/dev/null 2>&1; then
  echo "== installing cargo-afl"
  cargo install --locked cargo-afl
fi
# Builds AFL++ for this rustc once; says so and fails harmlessly when it is already built.
if ! out=$(cargo afl config --build 2>&1) && [[ "$out" != *"already built"* ]]; then
  echo "$out" >&2
  exit 1
fi

echo "== building the fuzz targets (fuzz/, dev profile)"
(cd fuzz && cargo afl build --features afl --bins)

export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_NO_AFFINITY=1 AFL_AUTORESUME=1
export AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_SKIP_CRASHES=1
# The Rust runtime aborts on a panic; AFL++ counts that as a crash.
export RUST_BACKTRACE=0

crashed=0 broken=0
for t in "${targets[@]}"; do
  out=fuzz/out/$t
  mkdir -p "$out"
  # A run killed mid-write (disk full, say) leaves stats afl-fuzz refuses to resume from.
  if [ -f "$out/default/fuzzer_stats" ] && ! grep -q '^start_time' "$out/default/fuzzer_stats"; then
    rm "$out/default/fuzzer_stats"
  fi
  echo "== fuzzing $t for ${seconds}s (findings in $out/default)"
  cargo afl fuzz -V "$seconds" -i "fuzz/corpus/$t" -o "$out" -x "fuzz/dict/$t.dict" \
    "fuzz/target/debug/$t" >"$out/afl.log" 2>&1 || {
      echo "afl-fuzz failed for $t; the end of its log ($out/afl.log):" >&2
      tail -n 30 "$out/afl.log" >&2
      broken=1
      continue
    }
  stats=$out/default/fuzzer_stats
  if [ -f "$stats" ]; then
    awk -F' *: *' '/^(execs_done|execs_per_sec|corpus_count|bitmap_cvg|saved_crashes|saved_hangs) /{printf "   %s: %s\n", $1, $2}' "$stats"
  fi
  # Replay every crash, this run's and earlier ones (a resumed run moves those to
  # crashes.<date>/): one counts until it no longer panics, so fixed ones stop failing runs.
  for f in "$out"/default/crashes*/id:*; do
    [ -e "$f" ] || continue
    if ! "fuzz/target/debug/$t" <"$f" >/dev/null 2>"$out/replay.err"; then
      echo "CRASH in $t: $f"
      grep -m1 -A1 "panicked at" "$out/replay.err" | sed 's/^/   /' || true
      crashed=1
    fi
  done
  for f in "$out"/default/hangs*/id:*; do
    [ -e "$f" ] || continue
    echo "slow input (AFL timeout) in $t: $f"
  done
done

if [ "$crashed" != 0 ]; then
  echo "== fuzzing found crashes (listed above); replay one with: fuzz/target/debug/TARGET < FILE"
fi
if [ "$broken" != 0 ]; then
  echo "== afl-fuzz itself failed for some target (see above)"
fi
[ "$crashed" = 0 ] && [ "$broken" = 0 ] || exit 1
echo "== no crashes"
