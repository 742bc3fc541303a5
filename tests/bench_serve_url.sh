#!/usr/bin/env bash
# `llmq bench serve --url` against a running `llmq serve` (the seeded default model, CPU backend):
# all at once under --max-concurrency and at a --request-rate, the JSON checked request by request
# (every request's tokens, each with its time, TTFT > 0, throughput = tokens / duration); failures
# counted apart (prompts past the vocabulary: some requests, then all); and a URL where nothing
# listens or a model the server does not serve: a clean error naming them, neither a crash nor a
# hang. Usage: bench_serve_url.sh LLMQ
set -u
llmq=$1
. "$(dirname "$0")/serve_script_support.sh"
bench() {  # bench NAME ARGS...: llmq bench serve ARGS, bounded in time; sets $rc, output in $work/NAME.{out,err}
  local name=$1
  shift
  timeout 120 "$llmq" bench serve "$@" > "$work/$name.out" 2> "$work/$name.err"
  rc=$?
}

start serve --model default --max-num-seqs 8
url="http://127.0.0.1:$port"

# ---- All at once, at most 4 in flight: 16 requests of 8 prompt and 8 output tokens.
bench conc --url "$url" --dataset fixed:8/8 --requests 16 --max-concurrency 4 --per-request --json "$work/conc.json"
cat "$work/conc.out" "$work/conc.err"
check "max-concurrency run: exit 0" $([ "$rc" = 0 ]; echo $?)
python3 - "$work/conc.json" "$url" 4 <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, len(lines)
j = json.loads(lines[0])
assert j["kind"] == "serve" and j["url"] == sys.argv[2] and j["model"] == "default", (j["kind"], j["url"], j["model"])
assert j["requests"] == 16 and j["requests_sent"] == 16 and j["failed"] == 0, (j["requests"], j["failed"])
assert j["output_tokens"] == 128 and j["prompt_tokens"] == 128, (j["output_tokens"], j["prompt_tokens"])
assert j["max_concurrency"] == int(sys.argv[3]) and j["token_times"] == "per token", (j["max_concurrency"], j["token_times"])
per = j["per_request"]
assert len(per) == 16
for r in per:
    assert "error" not in r, r
    assert r["output_tokens"] == 8 and len(r["token_s"]) == 8, r
    assert r["token_s"] == sorted(r["token_s"]) and r["token_s"][0] > r["arrival_s"], r
# TTFT > 0, TPOT over the requests' 7 gaps each, ITL one per gap; throughput is tokens / duration,
# and the duration spans the first send to the last token.
assert j["ttft"]["count"] == 16 and j["ttft"]["mean_ms"] > 0 and j["e2e"]["mean_ms"] >= j["ttft"]["mean_ms"]
assert j["tpot"]["count"] == 16 and j["itl"]["count"] == 16 * 7
d = j["duration_s"]
span = max(r["token_s"][-1] for r in per) - min(r["arrival_s"] for r in per)
assert d > 0 and abs(d - span) <= 1e-9 * max(1, span), (d, span)
assert abs(j["output_tokens_per_s"] - 128 / d) <= 1e-6 * j["output_tokens_per_s"], (j["output_tokens_per_s"], d)
assert abs(j["total_tokens_per_s"] - 256 / d) <= 1e-6 * j["total_tokens_per_s"]
assert abs(j["requests_per_s"] - 16 / d) <= 1e-6 * j["requests_per_s"]
EOF
check "max-concurrency run: 16 requests, 128 tokens, 8 times each, figures consistent" $?
grep -q "16 requests in" "$work/conc.out" && grep -q "TTFT" "$work/conc.out"
check "max-concurrency run: printed as the in-process bench prints" $?

# ---- Poisson arrivals: each request sent no earlier than its arrival (the in-process bench's
# workload at the same seed), the later ones after the earlier ones began.
bench rate --url "$url" --dataset fixed:8/8 --requests 8 --request-rate 40 --seed 3 --per-request --json "$work/rate.json"
check "request-rate run: exit 0" $([ "$rc" = 0 ]; echo $?)
python3 - "$work/rate.json" <<'EOF'
import json, sys
j = json.loads(open(sys.argv[1]).read())
assert j["requests"] == 8 and j["failed"] == 0 and j["output_tokens"] == 64 and j["rate"] == 40, j
arrivals = [r["arrival_s"] for r in j["per_request"]]
assert arrivals == sorted(arrivals) and arrivals[-1] > arrivals[0], arrivals  # spread out, in order
assert all(len(r["token_s"]) == 8 for r in j["per_request"])
EOF
check "request-rate run: 8 requests spread over time, in order, all tokens timed" $?

# ---- Prompts past the model's 512-token vocabulary: the server refuses those requests (400);
# they are counted and reported, the rest measured. Past it everywhere: every request fails, exit 1.
bench some --url "$url" --dataset fixed:8/4 --requests 16 --vocab-size 600 --json "$work/some.json"
python3 - "$work/some.json" <<'EOF'
import json, sys
j = json.loads(open(sys.argv[1]).read())
assert j["failed"] > 0 and j["requests"] > 0 and j["requests"] + j["failed"] == 16, (j["requests"], j["failed"])
assert j["output_tokens"] == 4 * j["requests"], j["output_tokens"]
assert sum(e["count"] for e in j["errors"]) == j["failed"] and "HTTP 400" in j["errors"][0]["error"], j["errors"]
EOF
check "some requests refused: counted apart, the rest measured, exit 0" $([ $? = 0 ] && [ "$rc" = 0 ] &&
  grep -q "requests failed (not in the figures above)" "$work/some.out"; echo $?)
bench all --url "$url" --dataset fixed:8/4 --requests 4 --vocab-size 1000000
check "every request refused: exit 1 naming the URL and the reason" $([ "$rc" = 1 ] &&
  grep -q "all 4 requests to $url failed: HTTP 400" "$work/all.err"; echo $?)

# ---- Refusals: a model the server does not serve, an engine option with --url, --url's own
# options without it.
bench model --url "$url" --model nope --requests 2
check "a model not served: exit 2 naming it" $([ "$rc" = 2 ] && grep -q "'nope' is not served at $url" "$work/model.err"; echo $?)
bench device --url "$url" --device cuda
check "--device with --url: refused by name" $([ "$rc" = 2 ] && grep -q -- "--device: not used with --url" "$work/device.err"; echo $?)
bench noturl --max-concurrency 4
check "--max-concurrency without --url: refused by name" $([ "$rc" = 2 ] && grep -q -- "--max-concurrency: only used with --url" "$work/noturl.err"; echo $?)

kill -TERM "$pid"
wait "$pid"

# ---- Nothing listening (the server above has exited and freed its port): an error naming the
# URL, at once, with and without --model.
bench gone --url "$url" --requests 2
check "nothing listening: exit 1 naming the URL" $([ "$rc" = 1 ] && grep -q "$url/v1/models: cannot connect" "$work/gone.err"; echo $?)
cat "$work/gone.err"
bench gone_model --url "$url" --model default --requests 2
check "nothing listening, --model given: exit 1 naming the URL" $([ "$rc" = 1 ] && grep -q "$url" "$work/gone_model.err"; echo $?)
bench badurl --url "https://127.0.0.1:$port"
check "https: refused by name" $([ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q "https is not supported" "$work/badurl.err"; echo $?)

echo "bench_serve_url: $fails failed"
[ "$fails" = 0 ]
