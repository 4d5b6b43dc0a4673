#!/usr/bin/env bash
# tests/testing/wait_ready.sh (ctest: testing_wait_ready, label cpu): a background process that
# exits makes wait_ready fail at once with its exit code and its log, though the deadline given is
# an hour (a wait_ready that waited for it would run into the test's TIMEOUT); one that becomes
# ready passes; one that stays unready fails at its deadline with its log. The checks are on the
# reported reason, not on times.
set -uo pipefail
source "$(cd "$(dirname "$0")" && pwd)/wait_ready.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "wait_ready_test: FAIL: $*"; failures=$((failures + 1)); }

# Exits 3 after a line on stderr; the readiness check never succeeds.
bash -c 'echo "cannot serve the model: no such file" >&2; sleep 0.3; exit 3' 2>"$dir/dead.log" &
# (Not in a $(...) subshell: wait_ready reads the exit code of a child of this shell.)
if wait_ready $! "$dir/dead.log" 3600 dead false >"$dir/report"; then
  fail "an exited server counted as ready"
fi
report=$(<"$dir/report")
[[ $report == *"dead: the server exited with code 3 before it was ready"* ]] ||
  fail "no exit code in the report: $report"
[[ $report == *"cannot serve the model: no such file"* ]] || fail "no log in the report: $report"

# Ready once a file appears.
bash -c "sleep 0.5; touch '$dir/ready'; sleep 30" 2>"$dir/live.log" &
live=$!
wait_ready "$live" "$dir/live.log" 3600 live test -e "$dir/ready" >/dev/null ||
  fail "a server that became ready was not"
kill "$live"

# Running but never ready: the deadline (1 s) ends the wait.
bash -c 'echo "still loading" >&2; sleep 30' 2>"$dir/slow.log" &
slow=$!
if wait_ready "$slow" "$dir/slow.log" 1 slow false >"$dir/report"; then
  fail "a server that never became ready was"
fi
report=$(<"$dir/report")
[[ $report == *"slow: the server is still running, but was not ready within 1 s"* &&
   $report == *"still loading"* ]] || fail "no deadline report: $report"
kill "$slow"

if ((failures > 0)); then exit 1; fi
echo "wait_ready_test: PASS"
