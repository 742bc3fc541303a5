# shellcheck shell=bash disable=SC2034  # the GPU_* variables are read by the scripts that source this
# What scripts/gpu-check and scripts/gpu-bench share (sourced, never run): the options every call
# takes, finding a binary in a build directory, running one step under a time limit with its
# output in $OUT, the loop over test binaries, and the summary table printed last.
#
# These scripts run on the lent GPU machine (see /work/.library/device/ where this workplace has
# it): the device tool copies the repository there, runs the command from its root and brings back
# what lands in $OUT (at most 8 files, so gpu_finish packs the logs into one archive when more were
# written). Without $OUT they write to /tmp/llmq-<script>.
#
# Binaries are looked up in the --bin directory as a build tree (bin/llmq, tests/test_cuda_*,
# bench/bench_cuda_*, the layout cmake gives build/release) or flat (every binary side by side, as
# a carried folder of binaries often is).

gpu_init() {  # gpu_init SCRIPT_NAME
  GPU_SCRIPT=$1
  GPU_BIN=build/release
  GPU_DRY=0
  GPU_SUMMARY=()
  GPU_LOGS=()
  GPU_FAILED=0
  GPU_ARGS=()
  GPU_PASS=()
  GPU_QUICK=0
  OUT=${OUT:-/tmp/llmq-$GPU_SCRIPT}
  mkdir -p "$OUT"
  export OUT
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  export LLMQ_COMMIT=${LLMQ_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
}

gpu_die() { echo "$GPU_SCRIPT: $*" >&2; exit 2; }

# gpu_from_caller PATH: PATH as given where the script was called (it runs from the repository root).
gpu_from_caller() {
  case $1 in
    /*) echo "$1" ;;
    *) echo "${GPU_CALLER_DIR:-$PWD}/$1" ;;
  esac
}

# gpu_parse_options ARGS...: the options both scripts take; the names left (areas or suites) go to
# GPU_ARGS, what follows `--` to GPU_PASS. Returns 1 when help was asked for (or nothing named).
gpu_parse_options() {
  while [ $# -gt 0 ]; do
    case $1 in
      -h|--help) return 1 ;;
      --bin) [ $# -ge 2 ] || gpu_die "--bin needs a directory"; GPU_BIN=$(gpu_from_caller "$2"); shift 2 ;;
      --bin=*) GPU_BIN=$(gpu_from_caller "${1#--bin=}"); shift ;;
      --testdata)
        [ $# -ge 2 ] || gpu_die "--testdata needs a directory"
        LLMQ_TESTDATA=$(gpu_from_caller "$2")
        export LLMQ_TESTDATA
        shift 2 ;;
      --dry-run|-n) GPU_DRY=1; shift ;;
      --quick) GPU_QUICK=1; shift ;;
      --) shift; GPU_PASS=("$@"); break ;;
      -*) gpu_die "unknown option $1 (see --help)" ;;
      *) GPU_ARGS+=("$1"); shift ;;
    esac
  done
  [ ${#GPU_ARGS[@]} -gt 0 ] || return 1
  if [ ! -d "$GPU_BIN" ]; then
    [ "$GPU_DRY" = 1 ] || gpu_die "no build directory $GPU_BIN (build with \`cmake --preset release && cmake --build --preset release\`, or name one with --bin DIR)"
    echo "$GPU_SCRIPT: dry run: $GPU_BIN does not exist here; printing the commands all the same"
  fi
  # The tests read PyTorch's reference conversions and the checked-in models from here.
  if [ -z "${LLMQ_TESTDATA:-}" ] && [ -d .devdata/testdata ]; then
    LLMQ_TESTDATA=$PWD/.devdata/testdata
    export LLMQ_TESTDATA
  fi
  return 0
}

# gpu_find NAME: the path of binary NAME under --bin (bin/, tests/, bench/ or flat), printed; false
# when there is none (a dry run prints where a build tree would hold it).
gpu_find() {
  local d
  for d in "$GPU_BIN/bin" "$GPU_BIN/tests" "$GPU_BIN/bench" "$GPU_BIN"; do
    [ -x "$d/$1" ] && [ -f "$d/$1" ] && { echo "$d/$1"; return 0; }
  done
  if [ "$GPU_DRY" = 1 ]; then
    case $1 in
      test_*) echo "$GPU_BIN/tests/$1" ;;
      bench_*) echo "$GPU_BIN/bench/$1" ;;
      *) echo "$GPU_BIN/bin/$1" ;;
    esac
    return 0
  fi
  return 1
}

# gpu_need NAME: like gpu_find, with the path in GPU_FOUND (not printed, so that a missing binary
# can be a failed row of the summary and a message in this shell).
gpu_need() {
  GPU_FOUND=$(gpu_find "$1") && return 0
  echo "$GPU_SCRIPT: $1 is not under $GPU_BIN (bin/, tests/, bench/ or flat); build it or name the directory with --bin" >&2
  gpu_fail "$1 MISSING"
  return 1
}

# gpu_glob PATTERN: every binary under --bin (tests/, bench/ or flat) whose name matches PATTERN.
gpu_glob() {
  local d f found=0
  for d in "$GPU_BIN/tests" "$GPU_BIN/bench" "$GPU_BIN/bin" "$GPU_BIN"; do
    for f in "$d"/$1; do
      { [ -f "$f" ] && [ -x "$f" ]; } || continue
      echo "$f"
      found=1
    done
    [ $found = 1 ] && return 0
  done
  [ "$GPU_DRY" = 1 ] && echo "$GPU_SCRIPT: dry run: no $1 under $GPU_BIN here" >&2
  return 0
}

gpu_note() { GPU_SUMMARY+=("$*"); }
gpu_fail() { GPU_FAILED=1; GPU_SUMMARY+=("$*"); }

# gpu_device FIELDS: one line per GPU (nvidia-smi --query-gpu=FIELDS).
gpu_device() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu="$1" --format=csv,noheader
  else
    echo "$GPU_SCRIPT: no nvidia-smi here: not a GPU machine"
  fi
}

# gpu_tool NAME PATHS...: a CUDA tool on PATH or at one of PATHS (globs), printed; false if none.
gpu_tool() {
  local name=$1 p
  shift
  command -v "$name" 2>/dev/null && return 0
  for p in "$@"; do
    [ -x "$p" ] && { echo "$p"; return 0; }
  done
  return 1
}

# gpu_run LIMIT STDOUT STDERR CMD...: CMD under `timeout LIMIT` (0: no limit) with its output in
# files (STDOUT '-': left on the terminal; STDERR '&': with STDOUT; a leading '+' appends).
# Returns CMD's status (124: timed out). A dry run prints the command (on stderr, so that
# a command's output captured with $(...) stays empty) and returns 0.
gpu_run() {
  local limit=$1 out=$2 err=$3 f
  shift 3
  local cmd=("$@")
  [ "$limit" != 0 ] && cmd=(timeout "$limit" "${cmd[@]}")
  if [ "$GPU_DRY" = 1 ]; then
    local shown
    shown=$(printf '%q ' "${cmd[@]}")
    case $out in -) ;; +*) shown+=">> ${out#+}" ;; *) shown+="> $out" ;; esac
    case $err in -) ;; '&') shown+=" 2>&1" ;; +*) shown+=" 2>> ${err#+}" ;; *) shown+=" 2> $err" ;; esac
    echo "dry: $shown" >&2
    for f in "$out" "$err"; do  # empty logs, so what reads them afterwards finds nothing
      case $f in -|'&'|/dev/*|+/dev/*) ;; *) touch "${f#+}" ;; esac
    done
    return 0
  fi
  for f in "$out" "$err"; do
    case $f in -|'&') ;; *) GPU_LOGS+=("${f#+}") ;; esac
  done
  case "$out|$err" in
    "-|-") "${cmd[@]}" ;;
    "-|&") "${cmd[@]}" 2>&1 ;;
    "-|+"*) "${cmd[@]}" 2>>"${err#+}" ;;
    "-|"*) "${cmd[@]}" 2>"$err" ;;
    "+"*"|&") "${cmd[@]}" >>"${out#+}" 2>&1 ;;
    *"|&") "${cmd[@]}" >"$out" 2>&1 ;;
    "+"*"|+"*) "${cmd[@]}" >>"${out#+}" 2>>"${err#+}" ;;
    "+"*"|-") "${cmd[@]}" >>"${out#+}" ;;
    "+"*) "${cmd[@]}" >>"${out#+}" 2>"$err" ;;
    *"|-") "${cmd[@]}" >"$out" ;;
    *"|+"*) "${cmd[@]}" >"$out" 2>>"${err#+}" ;;
    *) "${cmd[@]}" >"$out" 2>"$err" ;;
  esac
}

# gpu_verdict RC: how a step ended, for the summary.
gpu_verdict() {
  [ "$GPU_DRY" = 1 ] && { echo "(dry run)"; return; }
  case $1 in
    0) echo "rc=0" ;;
    124) echo "rc=124 TIMED OUT" ;;
    *) echo "rc=$1" ;;
  esac
}

# gpu_test LIMIT FAIL_PATTERN FAIL_LINES BINARY [ARGS...]: one GoogleTest binary, its log in
# $OUT/<name>.log (or appended to $GPU_TEST_LOG where set); the log's lines matching FAIL_PATTERN (at most FAIL_LINES) are printed and a
# row with the status and gtest's PASSED / FAILED / SKIPPED lines goes to the summary.
gpu_test() {
  local limit=$1 pattern=$2 lines=$3 binary=$4
  shift 4
  local name log rc start row
  name=$(basename "$binary")
  log=$OUT/$name.log
  if [ -n "${GPU_TEST_LOG:-}" ]; then  # one log for several binaries, appended
    log=$GPU_TEST_LOG
    echo "=== $name" >> "$log"
    start=$(wc -l < "$log")
    gpu_run "$limit" "+$log" '&' "$binary" "$@"
  else
    start=0
    gpu_run "$limit" "$log" '&' "$binary" "$@"
  fi
  rc=$?
  tail -n +$((start + 1)) "$log" | grep -E "$pattern" | head -"$lines"
  row="$name $(gpu_verdict $rc) $(tail -n +$((start + 1)) "$log" | grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' | tr '\n' ' ')"
  if [ $rc = 0 ]; then gpu_note "$row"; else gpu_fail "$row"; fi
  return $rc
}

# gpu_tests LIMIT FAIL_PATTERN FAIL_LINES BINARY...: gpu_test for each (the loop every area shares).
gpu_tests() {
  local limit=$1 pattern=$2 lines=$3 t
  shift 3
  [ $# -gt 0 ] || { [ "$GPU_DRY" = 1 ] || gpu_fail "no test binaries found under $GPU_BIN"; return 0; }
  for t in "$@"; do
    gpu_test "$limit" "$pattern" "$lines" "$t"
  done
  return 0
}

# gpu_step NAME LIMIT STDOUT STDERR CMD...: gpu_run, then a summary row "NAME rc=...".
gpu_step() {
  local name=$1
  shift
  gpu_run "$@"
  local rc=$?
  if [ $rc = 0 ]; then gpu_note "$name $(gpu_verdict 0)"; else gpu_fail "$name $(gpu_verdict $rc)"; fi
  return $rc
}

# gpu_nccl: NCCL for the tensor-parallel steps, the toolkit's or else the one PyTorch's wheels
# bring. The test binary reads LLMQ_NCCL_LIBRARY; llmq takes GPU_NCCL_FLAG (--nccl-library PATH).
gpu_nccl() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  local c
  if [ -z "${LLMQ_NCCL_LIBRARY:-}" ]; then
    for c in /usr/local/cuda/lib64/libnccl.so.2 /usr/local/cuda/lib/libnccl.so.2 \
             $(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null); do
      [ -f "$c" ] && { export LLMQ_NCCL_LIBRARY=$c; break; }
    done
  fi
  GPU_NCCL_FLAG=()
  [ -n "${LLMQ_NCCL_LIBRARY:-}" ] && GPU_NCCL_FLAG=(--nccl-library "$LLMQ_NCCL_LIBRARY")
  echo "NCCL: ${LLMQ_NCCL_LIBRARY:-not found}"
}

# gpu_finish: pack the logs when more files were written than the device brings back (8), print
# the summary, exit 1 if any step failed.
gpu_finish() {
  local n
  n=$(find "$OUT" -maxdepth 1 -type f | wc -l)
  if [ "$GPU_DRY" = 0 ] && [ "$n" -gt 8 ] && [ ${#GPU_LOGS[@]} -gt 0 ] && [ "${LLMQ_PACK_LOGS:-1}" = 1 ]; then
    local logs=() f
    for f in "${GPU_LOGS[@]}"; do
      [ -f "$f" ] && [ "$(dirname "$f")" = "$OUT" ] && logs+=("$(basename "$f")")
    done
    mapfile -t logs < <(printf '%s\n' "${logs[@]}" | sort -u)
    if [ ${#logs[@]} -gt 0 ] && (cd "$OUT" && tar czf "$GPU_SCRIPT-logs.tgz" "${logs[@]}" && rm -f "${logs[@]}"); then
      echo "$GPU_SCRIPT: $n files in $OUT: ${#logs[@]} logs packed into $OUT/$GPU_SCRIPT-logs.tgz"
    fi
  fi
  printf '%s\n' "---- summary ($GPU_SCRIPT ${GPU_ARGS[*]}; $OUT)" "${GPU_SUMMARY[@]}"
  [ "$GPU_DRY" = 1 ] && echo "(dry run: nothing was run)"
  exit "$GPU_FAILED"
}
