#!/bin/sh
# Runs a `--device cuda` command for a ctest that checks what llmq says on a machine without a
# GPU (its PASS_ and FAIL_REGULAR_EXPRESSION). Where the command succeeds the machine has a GPU and
# there is nothing to check: exit 77, which the test's SKIP_RETURN_CODE reports as skipped.
out=$("$@" 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
  echo "this machine has a CUDA GPU: the no-GPU message is checked only where there is none"
  exit 77
fi
printf '%s\n' "$out"
exit "$rc"
