#!/usr/bin/env bash
# `llmq chat` on the CPU backend with stories260K and a real chat template, held to `llmq serve`:
# each greedy reply must be what /v1/chat/completions answers for the same conversation (the earlier
# replies included as assistant messages), /reset must start the conversation again, a turn longer
# than the context is refused with the numbers and the chat goes on, and a model without a chat
# template is refused naming --chat-template. Exit 77 (skipped) without the shared test data.
# Usage: chat_cli.sh LLMQ TESTDATA_DIR TEMPLATE
set -u
llmq=$1
testdata=$2
template=$3
stories="$testdata/../models/stories260K.bin"
[ -f "$stories" ] || { echo "skip: $stories absent"; exit 77; }
work=$(mktemp -d)
server=""
trap '[ -n "$server" ] && kill -9 "$server" 2>/dev/null; rm -rf "$work"' EXIT
fails=0
check() {  # check NAME STATUS
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}

u1="Tell me a story about a cat."
u2="What did the cat do next?"
printf '%s\n%s\n/reset\n%s\n/exit\nnever read\n' "$u1" "$u2" "$u1" |
  "$llmq" chat --model "$stories" --chat-template "$template" -t 0 -n 24 > "$work/chat.out" 2> "$work/chat.err"
check "chat exits 0" $?

"$llmq" serve --model "$stories" --chat-template "$template" --served-model-name s --port 0 > "$work/serve.out" 2> "$work/serve.err" &
server=$!
port=""
for _ in $(seq 1 200); do
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/serve.out")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { echo "FAIL the server did not start"; cat "$work/serve.err"; exit 1; }
# The server's reply to a conversation (a JSON list of [role, content] pairs).
ask() {
  python3 - "$port" "$1" <<'PY'
import json, sys, urllib.request
port, turns = sys.argv[1], json.loads(sys.argv[2])
body = {"model": "s", "messages": [{"role": r, "content": c} for r, c in turns], "max_tokens": 24, "temperature": 0}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
# A sentinel after the text: $(...) would drop the reply's own trailing newlines.
print(json.load(urllib.request.urlopen(req))["choices"][0]["message"]["content"] + "|end|", end="")
PY
}
r1=$(ask "$(python3 -c 'import json,sys; print(json.dumps([["user", sys.argv[1]]]))' "$u1")")
r1=${r1%"|end|"}
r2=$(ask "$(python3 -c 'import json,sys; print(json.dumps([["user", sys.argv[1]], ["assistant", sys.argv[2]], ["user", sys.argv[3]]]))' "$u1" "$r1" "$u2")")
r2=${r2%"|end|"}
printf '%s\n%s\n%s\n' "$r1" "$r2" "$r1" > "$work/want.out"
echo "reply 1: $r1"
echo "reply 2: $r2"
check "replies are the server's for the same conversations (second turn sees the first; /reset forgets)" \
  $([ ${#r1} -gt 10 ] && [ "$r1" != "$r2" ] && cmp -s "$work/chat.out" "$work/want.out"; echo $?)
kill -TERM "$server"
wait "$server"
server=""

# A turn past the context is refused with the numbers; the next one is answered.
long=$(python3 -c 'print(" ".join(["word"] * 200))')
printf '%s\nhi\n' "$long" | "$llmq" chat --model "$stories" --chat-template "$template" -t 0 -n 8 --max-model-len 200 \
  > "$work/long.out" 2> "$work/long.err"
rc=$?
check "a conversation past --max-model-len is refused with both numbers, and the chat goes on" \
  $([ $rc -eq 0 ] && grep -q "tokens, the context 200" "$work/long.err" && [ "$(wc -l < "$work/long.out")" -eq 1 ]; echo $?)

echo hi | "$llmq" chat --model "$stories" > /dev/null 2> "$work/none.err"
rc=$?
check "no chat template: refused (status 2) naming --chat-template" $([ $rc -eq 2 ] && grep -q -- "--chat-template" "$work/none.err"; echo $?)
echo "chat_cli: $fails failed"
[ "$fails" -eq 0 ]
