# Sourced by the shell tests that start a server in the background (tests/deploy/image_smoke_test.sh,
# tests/gpu/concurrent_streams.sh).
#
# wait_ready PID LOG SECONDS WHAT COMMAND...
#   Runs COMMAND (a readiness check that exits 0 when ready, and itself returns within seconds)
#   every half second until it succeeds: returns 0. Returns 1 at once when the process PID has
#   exited first, printing "WHAT: the server exited with code N before it was ready" and LOG;
#   returns 1 after SECONDS, printing that it is still running and LOG (the caller stops it). PID
#   must be a background job of the calling shell, and wait_ready must run in that shell (not in
#   a $(...) subshell), so that the exit code can be read.
wait_ready() {
  local pid=$1 log=$2 seconds=$3 what=$4
  shift 4
  local deadline=$((SECONDS + seconds)) code
  while true; do
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      code=0
      wait "$pid" || code=$?
      echo "$what: the server exited with code $code before it was ready; its log ($log):"
      cat "$log"
      return 1
    fi
    if ((SECONDS >= deadline)); then
      echo "$what: the server is still running, but was not ready within $seconds s; its log ($log):"
      cat "$log"
      return 1
    fi
    sleep 0.5
  done
}
