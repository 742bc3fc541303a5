#!/usr/bin/env bash
# `llmq serve` driven by curl (a real HTTP client), on the CPU backend: the seeded default model
# (token-id prompts; no tokenizer), and stories260K (text prompts, its tokenizer) where the shared
# test data is present. Checks the endpoints, streaming, OpenAI's error objects and statuses, that a
# greedy completion is the text `llmq run` prints for the same prompt, and that SIGTERM ends the
# server with status 0. Usage: serve_curl.sh LLMQ TESTDATA_DIR [BACKEND ARGS]; BACKEND ARGS (e.g.
# "--device cuda") go to every `llmq serve` and `llmq run`, to run the same checks on the GPU.
set -u
llmq=$1
testdata=$2
read -r -a backend <<< "${3:-}"
source "$(dirname "$0")/serve_script_support.sh"  # $work, check, start (with $backend)
json_get() {  # json_get FILE PYTHON-EXPR (of j)
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"
}
post() {  # post PATH BODY OUTFILE [KEY] -> prints the HTTP status
  local auth=()
  [ $# -ge 4 ] && auth=(-H "Authorization: Bearer $4")
  curl -s -o "$3" -w '%{http_code}' "${auth[@]}" -H 'Content-Type: application/json' --data-binary "$2" \
    "http://127.0.0.1:$port$1"
}

# ---- The default model: token ids in, token ids out.
start default --model default --max-num-seqs 4 --api-key sk-test
key=sk-test
s=$(curl -s -o "$work/h" -w '%{http_code}' "http://127.0.0.1:$port/health"); check "health answers without a key" $([ "$s" = 200 ]; echo $?)
s=$(curl -s -o "$work/m" -w '%{http_code}' "http://127.0.0.1:$port/v1/models"); check "models needs the key (401)" $([ "$s" = 401 ]; echo $?)
s=$(curl -s -o "$work/m" -w '%{http_code}' -H "Authorization: Bearer $key" "http://127.0.0.1:$port/v1/models")
check "models lists the model" $([ "$s" = 200 ] && [ "$(json_get "$work/m" "j['data'][0]['id']")" = default ]; echo $?)
s=$(post /v1/completions '{"model":"default","prompt":[1,5,9],"max_tokens":5,"temperature":0}' "$work/c" $key)
check "completion: 5 tokens, length, usage" $([ "$s" = 200 ] &&
  [ "$(json_get "$work/c" "len(j['choices'][0]['token_ids']), j['choices'][0]['finish_reason'], j['usage']['total_tokens']")" = "5 length 8" ]; echo $?)
curl -s -N -H "Authorization: Bearer $key" --data-binary \
  '{"model":"default","prompt":[1,5,9],"max_tokens":5,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' \
  "http://127.0.0.1:$port/v1/completions" > "$work/stream"
python3 - "$work/stream" "$work/c" <<'EOF'
import json, sys
lines = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert lines[-1] == "[DONE]", lines[-1]
chunks = [json.loads(l) for l in lines[:-1]]
ids = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids", [])]
whole = json.load(open(sys.argv[2]))["choices"][0]["token_ids"]
assert ids == whole, (ids, whole)  # streamed greedy tokens are the non-streamed ones
assert chunks[-1]["usage"]["completion_tokens"] == 5 and chunks[-1]["choices"] == []
assert [ch["finish_reason"] for c in chunks[:-1] for ch in c["choices"]][-1] == "length"
EOF
check "streamed: the same tokens, [DONE], a usage chunk" $?
s=$(post /v1/completions '{"model":"default","prompt":[1,2]' "$work/e" $key)
check "invalid JSON: 400 with an error object" $([ "$s" = 400 ] && [ "$(json_get "$work/e" "j['error']['type']")" = invalid_request_error ]; echo $?)
s=$(post /v1/completions '{"model":"default","prompt":[1],"max_tokens":0}' "$work/e" $key)
check "max_tokens 0: 400 naming the field" $([ "$s" = 400 ] && [ "$(json_get "$work/e" "j['error']['param']")" = max_tokens ]; echo $?)
s=$(post /v1/completions '{"model":"other","prompt":[1]}' "$work/e" $key)
check "unknown model: 404" $([ "$s" = 404 ] && [ "$(json_get "$work/e" "j['error']['code']")" = model_not_found ]; echo $?)
long=$(python3 -c "print('{\"model\":\"default\",\"prompt\":[' + ','.join(['3']*1100) + ']}')")
s=$(post /v1/completions "$long" "$work/e" $key)
check "prompt past the context: 400 with the numbers" $([ "$s" = 400 ] && grep -q "maximum context length is 1024" "$work/e"; echo $?)
head -c $((17 << 20)) /dev/zero | tr '\0' 'a' > "$work/big"
s=$(curl -s -o "$work/e" -w '%{http_code}' -H "Authorization: Bearer $key" --data-binary @"$work/big" "http://127.0.0.1:$port/v1/completions")
check "a 17 MB body: 413" $([ "$s" = 413 ]; echo $?)
s=$(post /v1/chat/completions '{"model":"default","messages":[{"role":"user","content":"hi"}]}' "$work/e" $key)
check "chat without a tokenizer: 400" $([ "$s" = 400 ]; echo $?)
s=$(curl -s -o "$work/e" -w '%{http_code}' -H "Authorization: Bearer $key" -H 'Transfer-Encoding: chunked' \
  --data-binary '{"model":"default","prompt":[1]}' "http://127.0.0.1:$port/v1/completions")
check "a chunked upload (no length to hold to the limit): 411" $([ "$s" = 411 ]; echo $?)
kill -TERM "$pid"; wait "$pid"; rc=$?
check "SIGTERM: exit 0" $([ "$rc" = 0 ]; echo $?)

# ---- One generating request at a time (--http-threads 5 keeps 4 for the rest): a second is told
# "busy" at once; SIGTERM lets the stream in flight finish ([DONE], its full length) and exits 0.
start busy --model default --max-num-seqs 2 --http-threads 5
curl -s -N --data-binary '{"model":"default","prompt":[1,2,3],"max_tokens":300,"temperature":0,"stream":true}' \
  "http://127.0.0.1:$port/v1/completions" > "$work/long" &
for _ in $(seq 1 100); do grep -q '^data: ' "$work/long" && break; sleep 0.05; done
s=$(post /v1/completions '{"model":"default","prompt":[1],"max_tokens":2}' "$work/e")
check "a second generating request: 503 busy" $([ "$s" = 503 ] && grep -q "busy" "$work/e"; echo $?)
s=$(curl -s -o "$work/h" -w '%{http_code}' "http://127.0.0.1:$port/health")
check "health still answers" $([ "$s" = 200 ]; echo $?)
kill -TERM "$pid"; wait "$pid"; rc=$?
wait
python3 - "$work/long" <<'EOF2'
import json, sys
lines = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert lines[-1] == "[DONE]", lines[-3:]
chunks = [json.loads(l) for l in lines[:-1]]
assert sum(len(ch.get("token_ids", [])) for c in chunks for ch in c["choices"]) == 300
assert chunks[-1]["choices"][0]["finish_reason"] == "length"
EOF2
check "SIGTERM drains the stream in flight, then exits 0" $([ $? = 0 ] && [ "$rc" = 0 ]; echo $?)

# ---- stories260K: text in, text out, against `llmq run`.
stories="$testdata/../models/stories260K.bin"
if [ -f "$stories" ]; then
  start stories --model "$stories" --served-model-name s --max-num-seqs 4
  s=$(post /v1/completions '{"model":"s","prompt":"Once upon a time","max_tokens":30,"temperature":0}' "$work/t")
  got=$(json_get "$work/t" "j['choices'][0]['text']")
  want=$("$llmq" run ${backend[@]+"${backend[@]}"} --model "$stories" --prompt "Once upon a time" -n 40 -t 0 2>/dev/null | head -c 2000)
  python3 - "$got" "$want" <<'EOF'
import sys
got, want = sys.argv[1], sys.argv[2]
assert len(got) > 20 and ("Once upon a time" + got) in want, (got, want)
EOF
  check "greedy completion is what llmq run prints" $?
  curl -s -N --data-binary '{"model":"s","prompt":"Once upon a time","max_tokens":30,"temperature":0,"stream":true}' \
    "http://127.0.0.1:$port/v1/completions" > "$work/ts"
  python3 - "$work/ts" "$got" <<'EOF'
import json, sys
lines = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
text = "".join(ch["text"] for l in lines[:-1] for ch in json.loads(l)["choices"])
assert lines[-1] == "[DONE]" and text == sys.argv[2], (text, sys.argv[2])
EOF
  check "streamed text is the whole text" $?
  s=$(post /v1/completions '{"model":"s","prompt":"Once upon a time","max_tokens":30,"temperature":0,"stop":["."]}' "$work/st")
  check "a stop string cuts before it" $([ "$(json_get "$work/st" "j['choices'][0]['finish_reason']")" = stop ] &&
    python3 -c "import sys; g, w = sys.argv[1], sys.argv[2]; assert '.' not in g and w.startswith(g)" \
      "$(json_get "$work/st" "j['choices'][0]['text']")" "$got"; echo $?)
  # A stop token ends the completion, counts as a completion token, and is not part of the text: the
  # first token that has not come before (ids from llmq run) stops it; the text is the one of the
  # tokens before it.
  ids=$("$llmq" run ${backend[@]+"${backend[@]}"} --model "$stories" --prompt "Once upon a time" -n 15 -t 0 --ids 2>/dev/null)
  read -r k stop_id <<< "$(python3 -c "
import sys; ids = sys.argv[1].split()
k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i]); print(k, ids[k])" "$ids")"
  post /v1/completions "{\"model\":\"s\",\"prompt\":\"Once upon a time\",\"max_tokens\":10,\"temperature\":0,\"stop_token_ids\":[$stop_id]}" "$work/sid" > /dev/null
  post /v1/completions "{\"model\":\"s\",\"prompt\":\"Once upon a time\",\"max_tokens\":$k,\"temperature\":0}" "$work/before" > /dev/null
  check "a stop token ends the text before it (token $((k + 1)), id $stop_id) and counts in usage" $(
    [ "$(json_get "$work/sid" "j['choices'][0]['finish_reason'], j['usage']['completion_tokens']")" = "stop $((k + 1))" ] &&
    [ "$(json_get "$work/sid" "j['choices'][0]['text']")" = "$(json_get "$work/before" "j['choices'][0]['text']")" ]; echo $?)
  kill -TERM "$pid"; wait "$pid"
else
  echo "skip stories260K part: $stories absent"
fi
echo "serve_curl: $fails failed"
exit $((fails > 0))
