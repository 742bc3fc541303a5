#!/usr/bin/env bash
# `llmq serve`'s logprobs driven by curl, on the CPU backend: the seeded default model (token ids,
# tokens named "token_id:N") and, where the shared test data has it, stories260K (text, chat through
# a one-line template). Checks the shapes (completions: tokens, token_logprobs, top_logprobs,
# text_offset; chat: content entries with token, logprob, bytes, top_logprobs), that logprobs are
# log-probabilities (<= 0, the top list ordered, its mass at most 1), that a greedy token's logprob
# is the largest of its top list (its exp the largest probability), that a sampled token's dict
# holds it, that streaming gives the non-streamed lists, that the tokens' bytes are the text and
# the offsets point into it, and the fields' refusals.
# Usage: serve_logprobs_curl.sh LLMQ TESTDATA_DIR [BACKEND ARGS] (e.g. "--device cuda").
set -u
llmq=$1
testdata=$2
read -r -a backend <<< "${3:-}"
source "$(dirname "$0")/serve_script_support.sh"  # $work, check, start (with $backend)
post() {  # post PATH BODY OUTFILE -> prints the HTTP status
  curl -s -o "$3" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$2" "http://127.0.0.1:$port$1"
}
stream() {  # stream PATH BODY OUTFILE
  curl -s -N -H 'Content-Type: application/json' --data-binary "$2" "http://127.0.0.1:$port$1" > "$3"
}
# The Python checks: `python3 check.py KIND FILES...` (below), one per case.
cat > "$work/check.py" <<'EOF'
import json, math, sys

def sse(path):
    lines = [l[6:] for l in open(path).read().split("\n") if l.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines[-3:]
    return [json.loads(l) for l in lines[:-1]]

def completion_lists(lp, n_top, greedy, ids=None):
    n = len(lp["tokens"])
    assert n > 0 and all(len(lp[k]) == n for k in ("token_logprobs", "top_logprobs", "text_offset")), lp
    for i in range(n):
        tok, lpv, top = lp["tokens"][i], lp["token_logprobs"][i], lp["top_logprobs"][i]
        assert lpv <= 0 and all(v <= 0 for v in top.values()), (i, lpv, top)
        assert tok in top and top[tok] == lpv, (i, tok, top)  # the sampled token is always in its dict
        assert n_top <= len(top) <= n_top + 1, (i, n_top, top)  # the top N, plus the sampled one
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-5, top
        if greedy:  # exp of the greedy token's logprob is the largest probability of the list
            assert math.exp(lpv) == max(math.exp(v) for v in top.values()), (i, tok, top)
        if ids is not None:
            assert tok == "token_id:%d" % ids[i], (tok, ids[i])

def chat_content(content, n_top, greedy):
    assert len(content) > 0
    for i, e in enumerate(content):
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}, e
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == n_top, e
        top = [t["logprob"] for t in e["top_logprobs"]]
        assert top == sorted(top, reverse=True), top  # most likely first
        assert sum(math.exp(v) for v in top) <= 1 + 1e-5, top
        if greedy and n_top > 0:
            assert e["logprob"] == top[0] and e["token"] == e["top_logprobs"][0]["token"], e
            assert e["bytes"] == e["top_logprobs"][0]["bytes"], e

kind, files = sys.argv[1], sys.argv[2:]
if kind == "completion-ids":  # the default model: greedy, logprobs 5, streamed = whole
    whole = json.load(open(files[0]))["choices"][0]
    completion_lists(whole["logprobs"], 5, True, whole["token_ids"])
    assert whole["logprobs"]["text_offset"] == [0] * len(whole["token_ids"])  # no text without a tokenizer
    joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in sse(files[1]):
        for ch in c["choices"]:
            if ch["logprobs"] is not None:
                for k in joined: joined[k] += ch["logprobs"][k]
    assert joined == whole["logprobs"], (joined, whole["logprobs"])
elif kind == "completion-zero":  # logprobs 0: each dict holds the sampled token alone
    lp = json.load(open(files[0]))["choices"][0]["logprobs"]
    completion_lists(lp, 0, True)
    assert all(len(t) == 1 for t in lp["top_logprobs"])
elif kind == "completion-sampled":
    completion_lists(json.load(open(files[0]))["choices"][0]["logprobs"], 3, False)
elif kind == "no-logprobs":
    assert json.load(open(files[0]))["choices"][0]["logprobs"] is None
elif kind == "completion-text":  # stories260K: offsets into the text, tokens' text joined is the text
    ch = json.load(open(files[0]))["choices"][0]
    text, lp = ch["text"], ch["logprobs"]
    completion_lists(lp, 2, True)
    offsets = lp["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets), offsets
    for tok, off in zip(lp["tokens"], offsets):
        if not tok.startswith("bytes:"):
            assert text[off:off + len(tok)] == tok or off >= len(text), (tok, off, text)
    if not any(t.startswith("bytes:") for t in lp["tokens"]):
        assert "".join(lp["tokens"]) == text, (lp["tokens"], text)
elif kind == "chat":  # stories260K through a template: greedy, top 3, bytes are the text, streamed = whole
    whole = json.load(open(files[0]))["choices"][0]
    content = whole["logprobs"]["content"]
    chat_content(content, 3, True)
    assert bytes(b for e in content for b in e["bytes"]).decode("utf-8", "replace") == whole["message"]["content"]
    joined = []
    for c in sse(files[1]):
        for ch in c["choices"]:
            if ch["logprobs"] is not None:
                joined += ch["logprobs"]["content"]
    assert joined == content, (joined, content)
elif kind == "chat-zero":
    chat_content(json.load(open(files[0]))["choices"][0]["logprobs"]["content"], 0, True)
else:
    raise SystemExit("unknown check " + kind)
EOF
py() { python3 "$work/check.py" "$@"; }
param_is() {  # param_is FILE NAME: the error object names the field
  [ "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['error']['param'])" "$1")" = "$2" ]
}

# ---- The default model: token ids, tokens named by their ids.
start default --model default --max-num-seqs 4
b='{"model":"default","prompt":[1,5,9],"max_tokens":8,"temperature":0,"logprobs":5'
s=$(post /v1/completions "$b}" "$work/c")
stream /v1/completions "$b,\"stream\":true}" "$work/cs"
check "completions logprobs 5: shapes, <= 0, greedy is the largest, streamed = whole" $([ "$s" = 200 ] && py completion-ids "$work/c" "$work/cs"; echo $?)
s=$(post /v1/completions '{"model":"default","prompt":[1,5,9],"max_tokens":4,"temperature":0,"logprobs":0}' "$work/z")
check "completions logprobs 0: the sampled token's alone" $([ "$s" = 200 ] && py completion-zero "$work/z"; echo $?)
s=$(post /v1/completions '{"model":"default","prompt":[2,4],"max_tokens":12,"temperature":1.0,"seed":9,"logprobs":3}' "$work/r")
check "sampled at temperature 1: its dict holds the sampled token" $([ "$s" = 200 ] && py completion-sampled "$work/r"; echo $?)
s=$(post /v1/completions '{"model":"default","prompt":[1],"max_tokens":2}' "$work/n")
check "no logprobs asked: null" $([ "$s" = 200 ] && py no-logprobs "$work/n"; echo $?)
s=$(post /v1/completions '{"model":"default","prompt":[1],"logprobs":6}' "$work/e")
check "completions logprobs 6: 400 naming logprobs" $([ "$s" = 400 ] && param_is "$work/e" logprobs; echo $?)
s=$(post /v1/completions '{"model":"default","prompt":[1],"logprobs":true}' "$work/e")
check "completions logprobs true: 400 naming logprobs" $([ "$s" = 400 ] && param_is "$work/e" logprobs; echo $?)
kill -TERM "$pid"; wait "$pid"

# ---- stories260K: text, and chat through a one-line template.
stories="$testdata/../models/stories260K.bin"
if [ -f "$stories" ]; then
  printf '%s' '{% for m in messages %}{{ m.content }}{% endfor %}' > "$work/template.jinja"
  start stories --model "$stories" --served-model-name s --max-num-seqs 4 --chat-template "$work/template.jinja"
  s=$(post /v1/completions '{"model":"s","prompt":"Once upon a time","max_tokens":30,"temperature":0,"logprobs":2}' "$work/t")
  check "text completion: offsets into the text, tokens' text joined is the text" $([ "$s" = 200 ] && py completion-text "$work/t"; echo $?)
  b='{"model":"s","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":30,"temperature":0,"logprobs":true,"top_logprobs":3'
  s=$(post /v1/chat/completions "$b}" "$work/ch")
  stream /v1/chat/completions "$b,\"stream\":true}" "$work/chs"
  check "chat top_logprobs 3: entries, bytes are the text, greedy first, streamed = whole" $([ "$s" = 200 ] && py chat "$work/ch" "$work/chs"; echo $?)
  s=$(post /v1/chat/completions '{"model":"s","messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"temperature":0,"logprobs":true}' "$work/cz")
  check "chat logprobs true alone: empty top lists" $([ "$s" = 200 ] && py chat-zero "$work/cz"; echo $?)
  s=$(post /v1/chat/completions '{"model":"s","messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":21}' "$work/e")
  check "chat top_logprobs 21: 400 naming top_logprobs" $([ "$s" = 400 ] && param_is "$work/e" top_logprobs; echo $?)
  s=$(post /v1/chat/completions '{"model":"s","messages":[{"role":"user","content":"Hi"}],"top_logprobs":2}' "$work/e")
  check "chat top_logprobs without logprobs: 400" $([ "$s" = 400 ] && param_is "$work/e" top_logprobs; echo $?)
  kill -TERM "$pid"; wait "$pid"
else
  echo "skip stories260K part: $stories absent"
fi
echo "serve_logprobs_curl: $fails failed"
exit $((fails > 0))
