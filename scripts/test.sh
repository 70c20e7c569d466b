#!/usr/bin/env bash
# The test command (`make test`): the whole suite, slow tests included, as CI runs it.
#
# Tests marked `background` spend most of their time waiting rather than computing: the multi-host tests build an
# image (downloads) and wait out cut links; the real-Airflow tests (REST API, approval, asset event, browser) wait
# on the scheduler's and triggerer's loops; the TensorFlow jobs spend most of their time in two workers'
# single-threaded imports; the held-store tests wait out a store that answers nothing for 20-25 s. So they run in
# a second pytest process beside the rest instead of after it. The real-size test (also `own_lane`) streams 1 GB
# through an 8 MB/s proxy for ~15 minutes: it runs in a third process, after the multi-host tests (also
# `own_lane`), so no waiting lane is the longest.
# All three must pass; the other lanes' output is printed after the main run's.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# The TensorFlow engine's tests run, never skip: scripts/setup.sh made its venv (tests skip only without it and
# without this).
export RINGFLOW_REQUIRE_TF=1
out=test-output
mkdir -p "$out"
rm -rf "$out/background-tmp" "$out/own-lane-tmp"
"$PY" -m pytest -m "background and not own_lane" --durations=20 --basetemp="$out/background-tmp" -p no:cacheprovider \
  "$@" > "$out/background.log" 2>&1 &
background=$!
"$PY" -m pytest -m "own_lane" --durations=5 --basetemp="$out/own-lane-tmp" -p no:cacheprovider "$@" \
  > "$out/own-lane.log" 2>&1 &
own_lane=$!
PYTHONUNBUFFERED=1 "$PY" -m pytest -m "not background" --durations=40 "$@" 2>&1 | tee "$out/main.log"
main=${PIPESTATUS[0]}
wait "$background"
behind=$?
wait "$own_lane"
alone=$?
echo "=== tests marked background (ran beside the rest) ==="
cat "$out/background.log"
echo "=== tests marked own_lane (ran in a lane of their own) ==="
cat "$out/own-lane.log"
failed=0
# pytest's 5 is "no tests collected": a run with a -k or path that selects nothing in one of the lanes. A lane
# whose log has no pytest summary line ("... in 12.3s") did not end as pytest ends, whatever its code: something
# in a test ended the process itself (a thread left running that calls os._exit, as a rank's watchdog does on a
# stall with code 5, which would otherwise read as "no tests collected").
for lane in "main:$main:main.log" "background:$behind:background.log" "own_lane:$alone:own-lane.log"; do
  IFS=: read -r name code log <<< "$lane"
  if ! grep -qE '(^| )(no tests ran|[0-9]+ (passed|failed|errors?|skipped|deselected)).* in [0-9.]+s' "$out/$log"; then
    echo "tests failed: the $name lane ended without pytest's summary (exit $code): a test ended the process" >&2
    [ "$failed" -eq 0 ] && failed=$(( code == 0 || code == 5 ? 1 : code ))
  elif [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then
    echo "tests failed: the $name lane exited $code" >&2
    [ "$failed" -eq 0 ] && failed=$code
  fi
done
[ "$failed" -ne 0 ] && exit "$failed"
exit 0
