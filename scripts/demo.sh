#!/usr/bin/env bash
# `make demo`: the whole system (`payhooks run all`) plus the simulator driving 300 payments per
# provider (PROVIDERS, comma-separated, default xhub; xhub,standard,stripe: a mixed storm,
# payments dealt round-robin) with duplicates, reordering and lost webhooks (X-Hub's and
# Stripe's repaired by the reconciler against the simulator's API; a provider without an API is
# expected where its sent webhooks bring it), then a check of every payment against what
# payhooks did.
# Own database (payhooks_demo on DATABASE_URL's server) and queue prefix (demo.); DEMO_NAME
# (default demo) names both and the output files, DEMO_PORT_OFFSET moves every port, so a
# second demo can run beside another's.
# Nothing waits unbounded: PostgreSQL and RabbitMQ are checked first (scripts/preflight.py),
# the services get DEMO_READY_TIMEOUT seconds to be ready, the simulator DEMO_SIM_TIMEOUT;
# whatever this script started is stopped when it ends, however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-.venv/bin}
READY_TIMEOUT=${DEMO_READY_TIMEOUT:-60}
SIM_TIMEOUT=${DEMO_SIM_TIMEOUT:-300}
PROVIDERS=${PROVIDERS:-xhub}
PER_PROVIDER=${DEMO_PAYMENTS:-300}
NAME=${DEMO_NAME:-demo}
OFFSET=${DEMO_PORT_OFFSET:-0}
SERVICE_PORTS=()  # ingest, api, orders, bonuses, email, reconciler
for port in 8080 8081 9101 9102 9103 9104; do SERVICE_PORTS+=($((port + OFFSET))); done
SIM_PORT=$((8090 + OFFSET))
LOG=$NAME.log
IFS=, read -ra provider_list <<<"$PROVIDERS"
PAYMENTS=$((PER_PROVIDER * ${#provider_list[@]}))
# The reconciler's repairs of lost webhooks trail the storm: it sweeps every order at each
# provider's question budget (Stripe's 10 a second), so a mixed storm's last repairs come later.
# The check ends as soon as every payment is right; 30 s per provider is its ceiling.
CHECK_TIMEOUT=${DEMO_CHECK_TIMEOUT:-$((30 * ${#provider_list[@]}))}

command -v curl >/dev/null || { echo "payhooks demo: needs curl" >&2; exit 1; }

# The configured server (DATABASE_URL, else shared/config.py's default), database payhooks_demo.
DATABASE_URL=$("$BIN/python" -c '
import os, sys, urllib.parse
sys.path.insert(0, ".")
from shared.config import Settings
url = Settings.from_env({k: os.environ[k] for k in ["DATABASE_URL"] if k in os.environ}).database_url
print(urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path="/payhooks_" + sys.argv[1])))' "$NAME")
# The reconciler's timings are a few hundred times shorter than production's, so its questions
# come that much more often: the provider-call budget (XHUB_API_RATE) grows with them.
# Standard Webhooks' secret is whsec_ + base64 of the key ("demo-standard-secret"); Stripe's is
# used as given, and its API (STRIPE_API_URL, STRIPE_API_KEY) is the simulator's too.
export DATABASE_URL AMQP_PREFIX=$NAME. LOG_LEVEL=WARNING \
    XHUB_WEBHOOK_SECRETS=demo-secret ADMIN_TOKEN=demo-admin-token \
    STANDARD_WEBHOOK_SECRETS=whsec_ZGVtby1zdGFuZGFyZC1zZWNyZXQ= \
    STRIPE_WEBHOOK_SECRETS=whsec_demo_stripe_secret \
    XHUB_API_URL=http://127.0.0.1:$SIM_PORT XHUB_API_KEY=demo-provider-key \
    STRIPE_API_URL=http://127.0.0.1:$SIM_PORT STRIPE_API_KEY=sk_test_demo_stripe_key \
    RECONCILE_INTERVAL=2 RECONCILE_AFTER=3 XHUB_API_RATE=100 RETRY_DELAYS=0.5,1,2 \
    INGEST_PORT=${SERVICE_PORTS[0]} API_PORT=${SERVICE_PORTS[1]} ORDERS_PORT=${SERVICE_PORTS[2]} \
    BONUSES_PORT=${SERVICE_PORTS[3]} EMAIL_PORT=${SERVICE_PORTS[4]} RECONCILER_PORT=${SERVICE_PORTS[5]}

"$BIN/python" scripts/preflight.py --port "$SIM_PORT"

# Every demo starts from an empty database (`payhooks run all` migrates it into being): the
# previous demo's orders would otherwise be due for the reconciler's questions before this
# one's (docs/reconciliation.md), at the provider-call budget's pace.
"$BIN/python" - <<'PY'
import asyncio, os, urllib.parse
import asyncpg

async def drop() -> None:
    admin = urllib.parse.urlsplit(os.environ["DATABASE_URL"])._replace(path="/postgres")
    conn = await asyncpg.connect(urllib.parse.urlunsplit(admin), timeout=10)
    try:
        name = urllib.parse.urlsplit(os.environ["DATABASE_URL"]).path.lstrip("/")
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()

asyncio.run(drop())
PY

supervisor=
stop_all() {
    [[ -n $supervisor ]] && kill -0 "$supervisor" 2>/dev/null || return 0
    # The supervisor stops its services (each gets up to 20 s); SIGKILL only past that.
    kill -TERM "$supervisor" 2>/dev/null || true
    for _ in $(seq 1 120); do
        kill -0 "$supervisor" 2>/dev/null || break
        sleep 0.25
    done
    if kill -0 "$supervisor" 2>/dev/null; then
        local children
        children=$(pgrep -P "$supervisor" || true)
        kill -KILL "$supervisor" $children 2>/dev/null || true
    fi
    wait "$supervisor" 2>/dev/null || true
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
    echo "payhooks demo: $1; stopping everything it started. Last lines of $LOG:" >&2
    if [[ -s $LOG ]]; then tail -n 30 "$LOG" >&2; else echo "  (empty)" >&2; fi
    exit 1
}

"$BIN/payhooks" run all >"$LOG" 2>&1 &
supervisor=$!

deadline=$((SECONDS + READY_TIMEOUT))
for port in "${SERVICE_PORTS[@]}"; do
    until curl -sf --max-time 2 "localhost:$port/readyz" >/dev/null; do
        kill -0 "$supervisor" 2>/dev/null || fail "payhooks run all exited"
        if grep -q ' exited with .*; restarting' "$LOG"; then
            fail "a service exited while starting"
        fi
        ((SECONDS < deadline)) || fail "not ready within $READY_TIMEOUT s (localhost:$port/readyz)"
        sleep 0.5
    done
done

sim=("$BIN/payhooks" sim --provider "$PROVIDERS" --api-port "$SIM_PORT" --payments "$PAYMENTS" --duplicates 0.1 --reorder 0.2 --lost 0.03
    --concurrency 10 --linger 10 --check --check-timeout "$CHECK_TIMEOUT")
if command -v timeout >/dev/null; then
    sim=(timeout --foreground "$SIM_TIMEOUT" "${sim[@]}")  # Ctrl-C reaches the simulator
fi
status=0
"${sim[@]}" >"$NAME-summary.txt" || status=$?

for port in "${SERVICE_PORTS[@]}"; do
    echo "# localhost:$port/metrics"
    curl -sf --max-time 5 "localhost:$port/metrics" | grep '^payhooks_' || true
done >"$NAME-metrics.txt"

head -n 1 "$NAME-summary.txt" || true
grep '^MISMATCH' "$NAME-summary.txt" || true
sed -n '/^check:/,$p' "$NAME-summary.txt"
if ((status == 124)); then
    echo "payhooks demo: the simulator did not finish within $SIM_TIMEOUT s" >&2
fi
if ((status != 0)); then
    echo "payhooks demo: failed (exit $status). Last lines of $LOG:" >&2
    tail -n 20 "$LOG" >&2
fi
if grep -q ' exited with .*; restarting' "$LOG"; then
    echo "payhooks demo: a service exited during the run and was restarted: grep 'exited with' $LOG"
fi
show_url=$DATABASE_URL
if [[ $("$BIN/python" -c 'import sys, urllib.parse; print(urllib.parse.urlsplit(sys.argv[1]).password or "")' "$DATABASE_URL") ]]; then
    show_url="<DATABASE_URL with database payhooks_$NAME>"
fi
echo
echo "where to look:"
echo "  $NAME-summary.txt  every delivery and payment with its expected outcome"
echo "  $NAME-metrics.txt  /metrics of every service at the end (payhooks_* series)"
echo "  $LOG          the services' logs"
echo "  one payment:      DATABASE_URL=$show_url AMQP_PREFIX=$NAME. $BIN/payhooks payment show <id>"
echo "  live:             make run, then curl localhost:${SERVICE_PORTS[0]}/metrics (ingest), localhost:${SERVICE_PORTS[1]}/metrics (queues, DLQs)"
exit "$status"
