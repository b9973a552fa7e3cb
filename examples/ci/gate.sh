#!/usr/bin/env bash
# Demonstrates `xformopt bench` as a CI regression gate, end to end:
#
#   1. build (or reuse) a known-good MiniLM artifact with `xformopt optimize`;
#   2. bench it against its own report.json            -> expect exit 0 (no regression);
#   3. bench it against a doctored baseline whose artifact latency was divided by 3
#      ("the previous build was much faster")           -> expect exit 1 and a one-line message.
#
# Exits 0 only if both steps behaved as expected. Variables:
#   XFORMOPT   the command to run               [xformopt]
#   PYTHON     a Python 3 for doctoring JSON    [python3]
#   ART        artifact directory               [xformopt-ci/minilm]
#   REUSE      1: reuse $ART if it exists, 0: rebuild it   [1]
#   WORK       where bench outputs go           [$ART.bench]
#   BENCH_ARGS extra flags for both bench runs  [] (e.g. "--threads 2")
set -euo pipefail

XFORMOPT=${XFORMOPT:-xformopt}
PYTHON=${PYTHON:-python3}
ART=${ART:-xformopt-ci/minilm}
REUSE=${REUSE:-1}
WORK=${WORK:-$ART.bench}
read -r -a EXTRA <<< "${BENCH_ARGS:-}"

mkdir -p "$WORK"

# ---------------------------------------------------------------- 1. known-good artifact
if [[ "$REUSE" == 1 && -f "$ART/manifest.json" && -f "$ART/report.json" ]]; then
    echo "== reusing artifact $ART"
else
    echo "== building artifact $ART"
    $XFORMOPT --quiet optimize minilm -o "$ART" --limit 200 --force > "$WORK/optimize.txt"
fi

# ---------------------------------------------------------------- 2. bench vs its own report
echo "== bench $ART --baseline $ART/report.json (expect exit 0)"
set +e
$XFORMOPT --quiet bench "$ART" --baseline "$ART/report.json" "${EXTRA[@]}" \
    -o "$WORK/bench.json" --junit "$WORK/bench.xml" > "$WORK/self.txt" 2> "$WORK/self.err"
self_rc=$?
set -e
cat "$WORK/self.txt"
cat "$WORK/self.err" >&2
echo "-> exit $self_rc"

# ---------------------------------------------------------------- 3. doctored, much faster baseline
"$PYTHON" - "$ART/report.json" "$WORK/faster-baseline.json" <<'PY'
import json, sys

src, dst = sys.argv[1], sys.argv[2]
report = json.load(open(src))
lat = report["artifact"]["latency"]
for key in ("median_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms"):
    lat[key] /= 3
lat["repeat_medians_ms"] = [m / 3 for m in lat["repeat_medians_ms"]]
medians = lat["repeat_medians_ms"]
lat["spread_ms"] = (max(medians) - min(medians)) / 2 if len(medians) > 1 else 0.0
lat["throughput_per_s"] *= 3
json.dump(report, open(dst, "w"), indent=2)
print(f"doctored baseline: artifact median {lat['median_ms'] * 3:.2f} ms -> {lat['median_ms']:.2f} ms ({dst})")
PY

echo "== bench $ART --baseline $WORK/faster-baseline.json (expect exit 1)"
set +e
$XFORMOPT --quiet bench "$ART" --baseline "$WORK/faster-baseline.json" "${EXTRA[@]}" \
    --junit "$WORK/regression.xml" > "$WORK/faster.txt" 2> "$WORK/faster.err"
faster_rc=$?
set -e
cat "$WORK/faster.txt"
cat "$WORK/faster.err" >&2
echo "-> exit $faster_rc"

# ---------------------------------------------------------------- verdict
ok=1
if [[ $self_rc -ne 0 ]]; then
    echo "UNEXPECTED: bench against its own report exited $self_rc (expected 0)" >&2
    ok=0
fi
if [[ $faster_rc -ne 1 ]]; then
    echo "UNEXPECTED: bench against a 3x faster baseline exited $faster_rc (expected 1)" >&2
    ok=0
fi
if [[ $ok -eq 1 ]]; then
    echo "gate.sh: OK (own report passed, 3x faster baseline was caught)"
    exit 0
fi
echo "gate.sh: FAILED (outputs in $WORK)" >&2
exit 1
