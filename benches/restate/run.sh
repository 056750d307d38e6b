#!/bin/bash
# OpenProgram against Restate in the same run (issue 56): `openprogram load` and Restate's
# own durable steps (`ctx.run`, service.mjs) driven alike (driver.mjs), alternating, N
# pairs, one JSON line per run on stdout.
#   benches/restate/run.sh BIN [PAIRS] [EXECUTIONS] [STEPS] [CONCURRENCY] [-- LOAD ARGS]
# BIN is an openprogram binary (target/release/openprogram). Needs Node.js 20 and npm:
# Restate's server and SDK come from the npm registry into $RESTATE_WORK. Ports 8080, 9070,
# 9080 and 5122 must be free.
set -euo pipefail
BIN=$1; PAIRS=${2:-5}; E=${3:-1000}; S=${4:-10}; C=${5:-100}
shift $(( $# < 5 ? $# : 5 )); [ "${1:-}" = "--" ] && shift
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${RESTATE_WORK:-/tmp/openprogram-restate}
mkdir -p "$WORK"
if [ ! -d "$WORK/node_modules/@restatedev/restate-server" ]; then
  (cd "$WORK" && npm init -y >/dev/null && npm install --silent \
    @restatedev/restate-server@1.7.12 @restatedev/restate-sdk@1.17.2 >/dev/null)
fi
cp "$HERE/service.mjs" "$HERE/driver.mjs" "$WORK/"
rm -rf "$WORK/data"
"$WORK/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server" \
  --base-dir "$WORK/data" >"$WORK/server.log" 2>&1 &
SERVER=$!
(cd "$WORK" && RESTATE_LOGGING=WARN PORT=9080 exec node service.mjs >"$WORK/service.log" 2>&1) &
SERVICE=$!
trap 'kill $SERVICE $SERVER 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 1 100); do
  curl -sf localhost:9070/health >/dev/null && break; sleep 0.2
done
curl -sf localhost:9070/deployments -H 'content-type: application/json' \
  -d '{"uri":"http://localhost:9080"}' >/dev/null
# One run of each to warm both up, not reported.
node "$WORK/driver.mjs" http://localhost:8080 200 "$S" "$C" >/dev/null
for i in $(seq 1 "$PAIRS"); do
  DATA=$(mktemp -d)
  "$BIN" load --data "$DATA/data" --executions "$E" --steps "$S" --concurrency "$C" --json "$@" \
    | tail -1 | sed 's/^/{"system":"openprogram","load":/; s/$/}/'
  rm -rf "$DATA"
  node "$WORK/driver.mjs" http://localhost:8080 "$E" "$S" "$C"
done
