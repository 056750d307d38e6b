#!/bin/bash
# OpenProgram against Restate in the same run (issue 56): `openprogram load` and Restate's
# own durable steps (`ctx.run`, service.mjs) driven alike (driver.mjs), alternating, N
# pairs, one JSON line per run on stdout.
#   benches/restate/run.sh BIN [PAIRS [EXECUTIONS [STEPS [CONCURRENCY]]]] [-- LOAD ARGS]
# BIN is an openprogram binary (target/release/openprogram); `load` runs it embedded (the
# library in one process, no HTTP), as an embedder uses it, while Restate's steps go from
# its server to a Node.js service over HTTP, as Restate runs them. Needs Node.js 20 and npm
# (Restate's server and SDK come from the npm registry into $RESTATE_WORK) on x86-64 Linux;
# ports 8080, 9070, 9080 and 5122 must be free.
set -euo pipefail
BIN=$1; shift
POSITIONAL=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do POSITIONAL+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
PAIRS=${POSITIONAL[0]:-5}; E=${POSITIONAL[1]:-1000}; S=${POSITIONAL[2]:-10}; C=${POSITIONAL[3]:-100}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${RESTATE_WORK:-/tmp/openprogram-restate}
mkdir -p "$WORK"
if [ ! -d "$WORK/node_modules/@restatedev/restate-server" ]; then
  (cd "$WORK" && npm init -y >/dev/null && npm install --silent \
    @restatedev/restate-server@1.7.12 @restatedev/restate-sdk@1.17.2 >/dev/null)
fi
cp "$HERE/service.mjs" "$HERE/driver.mjs" "$WORK/"
rm -rf "$WORK/data"
PIDS=(); DATA=""
trap 'kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; [ -n "$DATA" ] && rm -rf "$DATA"' EXIT
"$WORK/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server" \
  --base-dir "$WORK/data" >"$WORK/server.log" 2>&1 &
PIDS+=($!)
(cd "$WORK" && RESTATE_LOGGING=WARN PORT=9080 exec node service.mjs >"$WORK/service.log" 2>&1) &
PIDS+=($!)
# wait_for URL [CURL ARGS]: until the URL answers (the service speaks HTTP/2 only).
wait_for() {
  for _ in $(seq 1 150); do curl -s -o /dev/null "${@:2}" "$1" && return 0; sleep 0.2; done
  echo "run.sh: $1 did not answer (see $WORK/*.log)" >&2; exit 1
}
wait_for localhost:9070/health
wait_for localhost:9080/ --http2-prior-knowledge
curl -sf localhost:9070/deployments -H 'content-type: application/json' \
  -d '{"uri":"http://localhost:9080"}' >/dev/null
# Restate warms up over its first runs (its service is JIT-compiled): one run, not reported.
node "$WORK/driver.mjs" http://localhost:8080 200 "$S" "$C" >/dev/null
for _ in $(seq 1 "$PAIRS"); do
  DATA=$(mktemp -d)
  "$BIN" load --data "$DATA/data" --executions "$E" --steps "$S" --concurrency "$C" --json "$@" \
    | tail -1 | sed 's/^/{"system":"openprogram","load":/; s/$/}/'
  rm -rf "$DATA"; DATA=""
  node "$WORK/driver.mjs" http://localhost:8080 "$E" "$S" "$C"
done
