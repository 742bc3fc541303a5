#!/usr/bin/env bash
# `llmq serve` against the official `openai` npm client (tests/serve_openai.mjs). The client is
# pinned by tests/package.json and tests/package-lock.json and installed with `npm ci` into the
# build tree (never the source tree), once: a later run that finds the pinned version there uses it.
# Exits 77 (ctest's SKIP_RETURN_CODE), its last line saying why, where node or npm is absent or the
# package cannot be installed (no registry reachable).
# Usage: serve_openai.sh LLMQ TESTDATA_DIR PACKAGE_DIR (a folder of the build tree)
set -u
llmq=$1
testdata=$2
dir=$3
here=$(cd "$(dirname "$0")" && pwd)
for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool is not installed (scripts/install-deps installs nodejs and npm)"
    exit 77
  fi
done
pinned=$(node -e "console.log(require(process.argv[1]).dependencies.openai)" "$here/package.json")
installed=$(node -e "try { console.log(require(process.argv[1]).version) } catch { console.log('none') }" \
  "$dir/node_modules/openai/package.json")
if [ "$installed" != "$pinned" ] || ! cmp -s "$here/package-lock.json" "$dir/package-lock.json"; then
  mkdir -p "$dir"
  cp "$here/package.json" "$here/package-lock.json" "$dir/"
  if ! (cd "$dir" && timeout 300 npm ci --no-audit --no-fund --loglevel=error) > "$dir/npm-ci.log" 2>&1; then
    cat "$dir/npm-ci.log"
    echo "SKIP: npm could not install openai@$pinned (is the npm registry reachable?)"
    exit 77
  fi
fi
echo "openai@$pinned on node $(node --version)"
exec node "$here/serve_openai.mjs" "$llmq" "$testdata" "$dir" "$here/data/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja"
