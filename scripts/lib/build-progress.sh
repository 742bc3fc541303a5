# Sourced by scripts/run: `build_with_progress PRESET TARGET...` builds with CMake and shows one
# progress line (percent done and an estimate of the time left) instead of every compiler call;
# the whole log goes to build/PRESET.log and its last lines are shown when the build fails.
build_with_progress() {
  local preset=$1
  shift
  local log="build/$preset.log"
  local jobs
  jobs=$(nproc 2>/dev/null || echo 2)
  mkdir -p build
  local start=$SECONDS last=-1 line percent elapsed left tty=0
  [ -t 2 ] && tty=1
  set +e
  cmake --build --preset "$preset" -j"$jobs" --target "$@" 2>&1 | tee "$log" | while IFS= read -r line; do
    case "$line" in
      \[*%\]*) ;;
      *) continue ;;
    esac
    percent=${line#[}
    percent=${percent%%%*}
    percent=${percent// /}
    [[ "$percent" =~ ^[0-9]+$ ]] || continue
    [ "$percent" -eq "$last" ] && continue
    elapsed=$((SECONDS - start))
    left=""
    if [ "$percent" -gt 0 ] && [ "$elapsed" -ge 5 ]; then
      left=", about $(( (elapsed * (100 - percent) / percent + 59) / 60 )) min left"
    fi
    if [ "$tty" = 1 ]; then
      printf '\rllmq: building (%s) %3d%%%s\033[K' "$preset" "$percent" "$left" >&2
    elif [ $((percent / 10)) -ne $((last / 10)) ] || [ "$last" -lt 0 ]; then
      printf 'llmq: building (%s) %3d%%%s\n' "$preset" "$percent" "$left" >&2
    fi
    last=$percent
  done
  local status=("${PIPESTATUS[@]}")
  set -e
  [ "$tty" = 1 ] && printf '\n' >&2
  if [ "${status[0]}" -ne 0 ]; then
    echo "llmq: the build failed; the end of $log:" >&2
    tail -n 40 "$log" >&2
    return "${status[0]}"
  fi
  echo "llmq: built in $((SECONDS - start)) s" >&2
}
