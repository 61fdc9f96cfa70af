#!/usr/bin/env bash
# A long libFuzzer run of tests/reliability/fuzz/fuzz_api.c (one process, no -jobs),
# whose figures go into the reliability report:
#
#   tests/reliability/fuzz/long_run.sh [RUNS]            default 10000000
#   nohup tests/reliability/fuzz/long_run.sh >/dev/null 2>&1 &     (30 to 60 minutes)
#
# It runs tests/reliability/fuzz/run.sh with one worker, -runs=RUNS and no time limit, keeps the
# whole output in $UNIMEM_FUZZ_BUILD_DIR/long_run.log (default
# build-fuzz/long_run.log), and writes docs/fuzz_long_run.md: the command,
# executions, rate, corpus, coverage, memory early and late in the run,
# the managers line, and the result. tests/reliability/reliability_report.sh includes
# that file. A crash leaves its input in the build directory (crash-*);
# minimise it with fuzz_api -minimize_crash=1 -runs=10000 FILE.
set -uo pipefail
runs=${1:-10000000}
root=$(cd "$(dirname "$0")/../../.." && pwd)
build=${UNIMEM_FUZZ_BUILD_DIR:-$root/build-fuzz}
log=$build/long_run.log
out=$root/docs/fuzz_long_run.md
mkdir -p "$build"

start=$(date -u +%Y-%m-%dT%H:%MZ)
t0=$(date +%s)
FUZZ_WORKERS=1 FUZZ_FLAGS="-runs=$runs" "$root/tests/reliability/fuzz/run.sh" 0 >"$log" 2>&1
rc=$?
secs=$(($(date +%s) - t0))

stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
# libFuzzer's status lines: "#N  pulse|NEW|REDUCE|DONE  cov: C ft: F corp: N/S ... rss: RMb"
last=$(grep -E "^#[0-9]+" "$log" | tail -1)
field() { echo "$last" | sed -n "s/.* $1: \([^ ]*\).*/\1/p"; }
# RSS at the first status line past one million executions, and at the end
early=$(grep -E "^#[0-9]{7,}" "$log" | head -1)
early_n=$(echo "$early" | sed -E 's/^#([0-9]+).*/\1/')
early_rss=$(echo "$early" | sed -n 's/.* rss: \([0-9]*\)Mb.*/\1/p')
result="passed: no crash, no model mismatch, no leak"
if [ $rc -ne 0 ]; then
  result="**FAILED** (exit $rc): $(grep -m1 -E "ERROR|model mismatch|fault backend" "$log")"
fi

cat >"$out" <<EOF
- Long run (\`tests/reliability/fuzz/long_run.sh $runs\`, started $start on $(uname -m),
  $(nproc) cores shared with other work; it runs \`FUZZ_WORKERS=1 FUZZ_FLAGS=-runs=$runs
  tests/reliability/fuzz/run.sh 0\`): **$(stat number_of_executed_units) executions in
  $secs s, $(stat average_exec_per_sec) executions/s**; corpus $(field corp) (from the
  $(ls "$root"/tests/reliability/fuzz/corpus | wc -l) kept inputs), coverage cov $(field cov), ft $(field ft);
  RSS ${early_rss:-?} MiB after ${early_n:-?} executions, peak $(stat peak_rss_mb) MiB at the end;
  $(grep "^fuzz_api: .* inputs run" "$log" | tail -1 | sed 's/^fuzz_api: //');
  $result.
EOF
cat "$out"
exit $rc
