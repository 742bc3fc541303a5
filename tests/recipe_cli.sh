#!/usr/bin/env bash
# llmq quantize / eval --recipe on the built-in default model: a two-group recipe (attention INT8,
# MLP FP8) with one module kept is written as compressed-tensors with two config groups whose
# targets are the exact module names and the kept module in `ignore`; the checkpoint reloads and
# evaluates; the recipe evaluates in memory; and the misuses (--recipe with --scheme, a bad
# override, a recipe that targets nothing) are refused with exit status 2 naming the option.
# Usage: recipe_cli.sh LLMQ
set -u
llmq=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
check() {  # check NAME STATUS
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
refused() {  # refused NAME PATTERN -- ARGS...: exit status 2 and PATTERN on stderr
  local name=$1 pattern=$2
  shift 3
  "$llmq" "$@" > "$work/out" 2> "$work/err"
  local rc=$?
  grep -q -- "$pattern" "$work/err"
  local found=$?
  [ "$rc" -eq 2 ] && [ "$found" -eq 0 ]
  check "$name (exit $rc)" $?
  [ "$rc" -eq 2 ] && [ "$found" -eq 0 ] || cat "$work/err"
}

cat > "$work/r.json" <<'JSON'
{
  "groups": [
    {"name": "attention", "scheme": "int8-w8a8", "targets": ["re:model\\.layers\\.[0-9]+\\.self_attn\\..*"]},
    {"name": "mlp", "scheme": "fp8-dynamic", "targets": ["re:model\\.layers\\.[0-9]+\\.mlp\\..*"]}
  ],
  "ignore": ["model.layers.3.mlp.down_proj"]
}
JSON

"$llmq" quantize --model default --recipe "$work/r.json" -o "$work/q" --json > "$work/quantize.json" 2> "$work/quantize.err"
check "quantize --recipe exits 0" $?
python3 - "$work/q/config.json" "$work/quantize.json" <<'PY'
import json, sys
q = json.load(open(sys.argv[1]))["quantization_config"]
summary = json.load(open(sys.argv[2]))
groups = q["config_groups"]
assert q["quant_method"] == "compressed-tensors", q["quant_method"]
assert q["llmq_scheme"] == "mixed", q["llmq_scheme"]
assert len(groups) == 2, list(groups)
by_scheme = {q["llmq_groups"][name]: g for name, g in groups.items()}
attn, mlp = by_scheme["int8-w8a8"], by_scheme["fp8-dynamic"]
assert attn["weights"]["type"] == "int" and mlp["weights"]["type"] == "float"
assert all("self_attn" in t and not t.startswith("re:") for t in attn["targets"]), attn["targets"]
assert len(attn["targets"]) == 4 * 4, len(attn["targets"])         # q k v o of 4 layers
assert len(mlp["targets"]) == 3 * 4 - 1, len(mlp["targets"])       # gate up down of 4 layers, one kept
assert "model.layers.3.mlp.down_proj" in q["ignore"] and "lm_head" in q["ignore"], q["ignore"]
assert "model.layers.3.mlp.down_proj" not in mlp["targets"]
assert summary["quantized_linears"] == 27, summary["quantized_linears"]
assert summary["format"] == "compressed-tensors", summary["format"]
print("checkpoint: 2 groups of exact names, ignore", q["ignore"])
PY
check "the checkpoint's quantization_config" $?

"$llmq" eval --model default --quantized "$work/q" --samples 2 --length 24 --json > "$work/eval_q.json" 2> "$work/eval_q.err"
check "eval --quantized on the mixed checkpoint exits 0" $?
"$llmq" eval --model default --recipe "$work/r.json" --samples 2 --length 24 --json > "$work/eval_r.json" 2> "$work/eval_r.err"
check "eval --recipe exits 0" $?
python3 - "$work/eval_q.json" "$work/eval_r.json" <<'PY'
import json, sys
q = json.load(open(sys.argv[1]))["results"]
r = json.load(open(sys.argv[2]))["results"]
assert len(q) == 1 and len(r) == 1, (len(q), len(r))
assert "mixed" in q[0]["scheme"], q[0]["scheme"]
assert r[0]["scheme"].startswith("recipe "), r[0]["scheme"]
# The checkpoint keeps lm_head and the kept module in BF16, the in-memory model in float32: close, not equal.
for row in (q[0], r[0]):
    assert 0.0 < row["kl_mean"] < 1.0, row["kl_mean"]
print("kl: checkpoint %.3g, in memory %.3g" % (q[0]["kl_mean"], r[0]["kl_mean"]))
PY
check "both evaluations report a KL" $?

refused "--recipe with --scheme" "give one of them" -- quantize --model default --recipe "$work/r.json" --scheme fp8-dynamic -o "$work/x"
refused "eval --recipe with --scheme" "give one of them" -- eval --model default --recipe "$work/r.json" --scheme fp8-dynamic
refused "--backoff 0" "backoff" -- quantize --model default --backoff 0 -o "$work/x"
refused "--backoff 2" "--backoff" -- quantize --model default --backoff 2 -o "$work/x"
refused "--smooth-alpha on a scheme that does not smooth" "does not smooth" -- quantize --model default --smooth-alpha 0.7 -o "$work/x"
printf '{"groups": [{"scheme": "fp8-dynamic", "targets": ["model.layers.9.mlp.up_proj"]}]}' > "$work/typo.json"
refused "a recipe target matching nothing" "model.layers.9.mlp.up_proj" -- quantize --model default --recipe "$work/typo.json" -o "$work/x"
printf '{"groups": [{"scheme": "fp8-dynamic", "targets": ["re:.*"]}], "colour": 1}' > "$work/unknown.json"
refused "an unknown recipe key" "colour" -- eval --model default --recipe "$work/unknown.json"
# NaN passes CLI11's Range; with --recipe it used to read as "unset" and the run went on.
refused "--smooth-alpha nan with --recipe" "smooth-alpha" -- quantize --model default --recipe "$work/r.json" --smooth-alpha nan -o "$work/x"
refused "--backoff nan with --recipe" "backoff" -- eval --model default --recipe "$work/r.json" --backoff nan
# No scheme of this recipe smooths: the alpha would change nothing, as with --scheme.
refused "--smooth-alpha with a recipe that does not smooth" "smooths" -- quantize --model default --recipe "$work/r.json" --smooth-alpha 0.7 -o "$work/x"
refused "eval --smooth-alpha with a recipe that does not smooth" "smooths" -- eval --model default --recipe "$work/r.json" --smooth-alpha 0.7
printf '{"groups": [{"scheme": "fp8-dynamic", "targets": ["re:.*"]}], "smooth_alpha": 0.6}' > "$work/alpha.json"
refused "a recipe file's smooth_alpha with no smoothing scheme" "smooth_alpha" -- quantize --model default --recipe "$work/alpha.json" -o "$work/x"
[ ! -e "$work/x" ]
check "refused runs write nothing" $?

# --backoff and --smooth-alpha with --scheme change the scales: the checkpoints differ.
"$llmq" calibrate --model default --samples 4 --length 32 -o "$work/stats.json" > /dev/null 2>&1
check "calibrate" $?
"$llmq" quantize --model default --scheme int8-smoothquant --stats "$work/stats.json" --smooth-alpha 0.8 --backoff 0.9 \
  -o "$work/s1" > /dev/null 2>&1
check "quantize --scheme int8-smoothquant --smooth-alpha 0.8 --backoff 0.9" $?
"$llmq" quantize --model default --scheme int8-smoothquant --stats "$work/stats.json" -o "$work/s2" > /dev/null 2>&1
check "quantize --scheme int8-smoothquant" $?
! cmp -s "$work/s1/model.safetensors" "$work/s2/model.safetensors"
check "the overrides change the weights written" $?

[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all recipe CLI checks passed"
