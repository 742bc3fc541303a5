# Sourced by the shell tests that drive a running `llmq serve` (bash; set $llmq first, and the array
# $backend for extra `llmq serve` arguments if any): a work folder removed at exit together with
# every server started, check NAME STATUS (counted in $fails), and start NAME ARGS..., which runs
# `llmq serve --port 0 ARGS` and waits for its "listening" line, setting $port and $pid.
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
fails=0
check() {  # check NAME CONDITION-STATUS
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
start() {  # start NAME ARGS...
  local name=$1
  shift
  "$llmq" serve --port 0 ${backend[@]+"${backend[@]}"} "$@" > "$work/$name.out" 2> "$work/$name.err" &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 1 200); do
    port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/$name.out")
    [ -n "$port" ] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL $name did not start:"; cat "$work/$name.err"
  exit 1
}
