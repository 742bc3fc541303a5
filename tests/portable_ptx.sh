#!/bin/sh
# The portable build embeds compute_80 PTX that the driver compiles at load on GPUs other than
# Hopper; an instruction that needs sm_89+ (E4M3 conversions, wgmma) left unguarded in it builds
# cleanly but fails to load there, taking the whole module down. This assembles each given source's
# compute_80 PTX for sm_80 with ptxas, which names such an instruction.
# usage: portable_ptx.sh NVCC SOURCE_ROOT FILE...   (FILE relative to SOURCE_ROOT)
set -e
nvcc=$1 root=$2
shift 2
ptxas=$(dirname "$nvcc")/ptxas
[ -x "$ptxas" ] || ptxas=ptxas
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for f in "$@"; do
  if ! "$nvcc" -gencode=arch=compute_80,code=compute_80 -O3 -DNDEBUG -std=c++17 -DLLMQ_WITH_CUDA=1 \
       -I"$root/src" -I"$root/include" -ptx "$root/$f" -o "$work/f.ptx" 2> "$work/err"; then
    echo "FAIL $f: nvcc"; cat "$work/err"; status=1; continue
  fi
  if ! "$ptxas" -arch=sm_80 "$work/f.ptx" -o "$work/f.cubin" 2> "$work/err"; then
    echo "FAIL $f: its compute_80 PTX does not assemble for sm_80"; head -5 "$work/err"; status=1; continue
  fi
  echo "ok $f"
done
exit $status
