#!/usr/bin/env bash
# The README's "Interactive use" walkthrough, run end to end: the same commands, in the same order, against
# `whet stack up` + `whet dev` started here (in the background instead of other terminals). Exits non-zero,
# naming the step, when any command fails or an answer is not what the README promises (a model that passed
# the gate, promoted to production, answering a chat, downloaded with every sha256 checked).
#
#   make walkthrough                      # or: bash deploy/tools/walkthrough.sh [WORK_DIR]
#
# Everything lives in WORK_DIR (default: a new directory under .whetstone/): the stack's data, the base model,
# the key, the loss curve and the downloaded adapter. Free ports are picked, so a `whet dev` already running on
# 8000 is left alone. WHETSTONE_KEEP=1 keeps WORK_DIR afterwards (it is removed on success otherwise).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
[ -f .venv/.installed ] || make venv   # a fresh clone: `make venv` once, as the README says
export PATH="$ROOT/.venv/bin:$PATH"

WORK=${1:-"$ROOT/.whetstone/walkthrough-$(date +%s)"}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
export WHETSTONE_DATA_DIR="$WORK/data"
free_port() { python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export WHETSTONE_API_PORT=$(free_port)
export WHETSTONE_SCHEDULER_HTTP_PORT=$(free_port)
for svc in INGEST TRAINER_AGENT EVAL REGISTRY METERING SERVING; do export "WHETSTONE_${svc}_HTTP_PORT=0"; done
export WHETSTONE_LOG_LEVEL=${WHETSTONE_LOG_LEVEL:-WARNING}

STEP="start"
PIDS=()
began=$(date +%s)
finish() {
    code=$?
    for (( i=${#PIDS[@]}-1; i>=0; i-- )); do   # whet dev first, then the stack
        kill -TERM "${PIDS[i]}" 2>/dev/null || true
        wait "${PIDS[i]}" 2>/dev/null || true
    done
    if [ "$code" -ne 0 ]; then
        echo "walkthrough FAILED at step '$STEP' (exit $code) after $(( $(date +%s) - began ))s; logs: $WORK/*.log" >&2
    elif [ "${WHETSTONE_KEEP:-0}" = 1 ]; then
        echo "walkthrough passed in $(( $(date +%s) - began ))s; kept $WORK"
    else
        echo "walkthrough passed in $(( $(date +%s) - began ))s"
        rm -rf "$WORK"
    fi
}
trap finish EXIT
step() { STEP="$1"; echo; echo "\$ $1"; }
fail() { echo "walkthrough: $*" >&2; exit 1; }
wait_for() {   # FILE PATTERN SECONDS PID: until FILE holds PATTERN (the process must stay up)
    for _ in $(seq "$3"); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        kill -0 "$4" 2>/dev/null || { tail -20 "$1" >&2; fail "$(basename "$1" .log) ended before it was ready"; }
        sleep 1
    done
    tail -20 "$1" >&2
    fail "$(basename "$1" .log) not ready after $3 s"
}

# terminal 1: the embedded Kafka + PostgreSQL + S3
step "whet stack up"
whet stack up > "$WORK/stack.log" 2>&1 &
PIDS+=($!)
wait_for "$WHETSTONE_DATA_DIR/stack.env" WHETSTONE_S3_ENDPOINT 600 "${PIDS[0]}"
echo "stack up (log $WORK/stack.log)"

# terminal 2
step "whet models create-tiny"
whet models create-tiny
step "whet dev"
whet dev > "$WORK/dev.log" 2>&1 &
PIDS+=($!)
wait_for "$WORK/dev.log" "public API:" 900 "${PIDS[1]}"
grep "public API:" "$WORK/dev.log"

# terminal 3
step "export WHETSTONE_API_KEY=\$(whet keys create demo --scope read --scope write --scope models:promote | tail -1)"
WHETSTONE_API_KEY=$(whet keys create demo --scope read --scope write --scope models:promote | tail -1)
export WHETSTONE_API_KEY
echo "${WHETSTONE_API_KEY:0:16}…"
export WHETSTONE_BASE_URL="http://127.0.0.1:$WHETSTONE_API_PORT/v1"

step "whet files upload examples/datasets/chat_demo.jsonl --wait"
FILE_ID=$(whet files upload examples/datasets/chat_demo.jsonl --wait | tee /dev/stderr | tail -1)
[[ "$FILE_ID" == file-* ]] || fail "no file id from the upload"

step "whet jobs create --training-file $FILE_ID --suffix first --follow --loss-png loss.png"
JOB_ID=$(whet jobs create --training-file "$FILE_ID" --suffix first --follow --loss-png "$WORK/loss.png" | tail -1)
[[ "$JOB_ID" == ftjob-* ]] || fail "no job id from jobs create"
[ -s "$WORK/loss.png" ] || fail "no loss curve written"

step "whet jobs list"
whet jobs list
whet jobs list | grep "$JOB_ID" | grep -q "eval=passed" || fail "the first job's model did not pass the eval gate"

step "whet jobs checkpoints $JOB_ID"
whet jobs checkpoints "$JOB_ID"

MODEL=""
for _ in $(seq 120); do   # the job learns its model's name once the registry announced it
    MODEL=$(whet jobs get "$JOB_ID" --json | python -c 'import json, sys; print(json.load(sys.stdin)["fine_tuned_model"] or "")')
    [ -n "$MODEL" ] && break
    sleep 1
done
[ -n "$MODEL" ] || fail "job $JOB_ID has no fine_tuned_model"

step "whet models promote $MODEL"
whet models promote "$MODEL"
whet models get "$MODEL" --json | python -c 'import json, sys; m = json.load(sys.stdin); assert m["stage"] == "production", m["stage"]' \
    || fail "$MODEL is not in production after promote"

step "python -c '… c.chat.completions.create(model=\"$MODEL\", …)'"
ANSWER=""
for _ in $(seq 120); do   # serving follows the promotion from the bus
    if ANSWER=$(python -c 'import openai, os, sys; c = openai.OpenAI(base_url=os.environ["WHETSTONE_BASE_URL"], api_key=os.environ["WHETSTONE_API_KEY"], max_retries=0); print(repr(c.chat.completions.create(model=sys.argv[1], messages=[{"role": "user", "content": "What is 3 + 4?"}]).choices[0].message.content))' "$MODEL" 2>"$WORK/chat.err"); then
        break
    fi
    sleep 1
done
[ -n "$ANSWER" ] || { cat "$WORK/chat.err" >&2; fail "$MODEL did not answer a chat completion"; }
echo "$ANSWER"

step "whet models download $MODEL --out my-adapter"
whet models download "$MODEL" --out "$WORK/my-adapter"
[ -s "$WORK/my-adapter/adapter_model.safetensors" ] && [ -s "$WORK/my-adapter/adapter_config.json" ] \
    || fail "the adapter was not downloaded"

step "whet usage"
whet usage
