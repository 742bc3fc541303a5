#!/usr/bin/env bash
# `cmake --install` of this build into a temporary prefix, then programs built against the installed
# package only (not the build tree), as a user's project would build them:
#   - the files: bin/llmq, the static and shared libraries, the public headers, the CMake package,
#     the pkg-config file;
#   - every installed header compiles on its own, with only the prefix and the system's default
#     directories on the include path (no CUDA headers: none of them includes one);
#   - the versions agree: project(), llmq/version.hpp, llmqConfigVersion.cmake, llmq.pc, `llmq
#     --version` and llmq::library_version() in the examples;
#   - examples/ configured with find_package(llmq) (shared and static) and with pkg-config, built,
#     run: quantize_tensor's FP8 error within E4M3's bound, the same line from all three builds;
#   - with CUDA and a GPU: gpu_generate's greedy tokens are `llmq run --device cuda`'s.
# Usage: install_consumer.sh BUILD_DIR SOURCE_DIR TESTDATA_DIR
set -u
build=$1
src=$2
testdata=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fails=0
check() {  # check NAME STATUS
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
jobs=$(nproc 2>/dev/null || echo 2)

cmake --install "$build" --prefix "$prefix" > "$work/install.log" 2>&1
check "cmake --install" $?
libdir=$(dirname "$(find "$prefix" -name llmqConfig.cmake -path '*/cmake/llmq/*' | head -1)")
libdir=${libdir%/cmake/llmq}
missing=0
for f in bin/llmq include/llmq/llmq.hpp include/llmq/version.hpp; do [ -f "$prefix/$f" ] || { echo "missing $f"; missing=1; }; done
for f in libllmq.a libllmq.so cmake/llmq/llmqConfig.cmake cmake/llmq/llmqConfigVersion.cmake cmake/llmq/llmqTargets.cmake pkgconfig/llmq.pc; do
  [ -e "$libdir/$f" ] || { echo "missing <libdir>/$f"; missing=1; }
done
check "installed files (libdir ${libdir#"$prefix"/})" $missing
n_src=$(ls "$src"/include/llmq/*.hpp | wc -l)
n_inst=$(ls "$prefix"/include/llmq/*.hpp | wc -l)
check "every public header installed ($n_src + version.hpp = $n_inst)" $([ $((n_src + 1)) -eq "$n_inst" ]; echo $?)

# Headers: self-contained, and free of CUDA headers.
grep -l '#include <cu\|#include "cu\|#include <nccl' "$prefix"/include/llmq/*.hpp > "$work/cuda_includes"
check "no installed header includes a CUDA header" $([ ! -s "$work/cuda_includes" ]; echo $?)
ls "$prefix"/include/llmq/*.hpp | xargs -P "$jobs" -I{} sh -c \
  'printf "#include \"llmq/%s\"\n" "$(basename "$1")" | c++ -std=c++17 -fsyntax-only -Wall -Wextra -Werror -I"$2/include" -x c++ - 2>&1 || echo "FAILED $1"' \
  sh {} "$prefix" > "$work/headers.log"
check "every installed header compiles on its own without CUDA on the include path" $(! grep -q FAILED "$work/headers.log"; echo $?)
grep -A3 FAILED "$work/headers.log" | head -20

# Versions.
project_version=$(sed -n 's/^project(llmq VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
header_version=$(sed -n 's/^#define LLMQ_VERSION_STRING "\(.*\)"/\1/p' "$prefix/include/llmq/version.hpp")
package_version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")/\1/p' "$libdir/cmake/llmq/llmqConfigVersion.cmake")
pc_version=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --modversion llmq 2>/dev/null)
cli_version=$("$prefix/bin/llmq" --version 2>/dev/null | sed -n '1s/^llmq \([^ ]*\) .*/\1/p')
echo "versions: project $project_version, header $header_version, package $package_version, pkg-config $pc_version, llmq --version $cli_version"
check "one version everywhere" $([ -n "$project_version" ] && [ "$header_version" = "$project_version" ] &&
  [ "$package_version" = "$project_version" ] && [ "$pc_version" = "$project_version" ] &&
  [ "$cli_version" = "$project_version" ]; echo $?)

# The examples, against the installed package: shared, static, pkg-config.
build_examples() {  # build_examples DIR EXTRA-CMAKE-ARGS...
  local dir=$1
  shift
  cmake -S "$src/examples" -B "$dir" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release "$@" > "$dir.log" 2>&1 &&
    cmake --build "$dir" -j"$jobs" >> "$dir.log" 2>&1
}
build_examples "$work/shared"
check "examples build with find_package(llmq) (shared)" $?
build_examples "$work/static" -DLLMQ_EXAMPLES_STATIC=ON
check "examples build with find_package(llmq) (static)" $?
(cd "$work" && c++ -std=c++17 -O1 "$src/examples/quantize_tensor.cpp" -o "$work/quantize_tensor_pc" \
  $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs llmq)) > "$work/pc.log" 2>&1
check "quantize_tensor builds with pkg-config" $?
for f in "$work"/shared.log "$work"/static.log "$work"/pc.log; do grep -iE "error|warning" "$f" | head -5; done
ldd "$work/shared/quantize_tensor" 2>/dev/null | grep -q "$libdir/libllmq.so"
check "the shared example runs on the installed libllmq.so" $?
check "the static example holds llmq itself (no libllmq.so)" $(! ldd "$work/static/quantize_tensor" 2>/dev/null | grep -q "libllmq.so"; echo $?)
pc_libdir=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --variable=libdir llmq 2>/dev/null)
check "the pkg-config file points into the prefix it was installed to" $([ "$(cd "$pc_libdir" 2>/dev/null && pwd -P)" = "$(cd "$libdir" && pwd -P)" ]; echo $?)

model=default
[ -f "$testdata/../models/stories260K.bin" ] && model="$testdata/../models/stories260K.bin"
for variant in shared static pc; do
  exe="$work/$variant/quantize_tensor"
  [ "$variant" = pc ] && exe="$work/quantize_tensor_pc"
  "$exe" "$model" 1 > "$work/qt-$variant.out" 2>> "$work/qt.err"
  echo "quantize_tensor ($variant): $(cat "$work/qt-$variant.out")"
done
line=$(cat "$work/qt-shared.out")
# E4M3 keeps 3 mantissa bits: a normal value rounds to within 1/16 of itself, so the relative RMS
# error of a matrix scaled into E4M3's range is at most 1/16; it is above 0 for any real weights.
err=$(echo "$line" | sed -n 's/.*relative rms error \([^,]*\),.*/\1/p')
check "quantize_tensor: llmq $project_version, relative RMS error $err in (0, 1/16]" $(python3 -c "
import sys; e = float(sys.argv[1]); sys.exit(0 if 0 < e <= 1 / 16 else 1)" "${err:-nan}" 2>/dev/null &&
  echo "$line" | grep -q "^llmq $project_version, "; echo $?)
check "the static and pkg-config builds print the same line" $([ -n "$line" ] &&
  [ "$(cat "$work/qt-static.out")" = "$line" ] && [ "$(cat "$work/qt-pc.out")" = "$line" ]; echo $?)
"$work/shared/quantize_tensor" "$model" 100000 > /dev/null 2>&1
check "quantize_tensor refuses an index out of range (status 2)" $([ $? -eq 2 ]; echo $?)
"$work/shared/quantize_tensor" "$work/no-such-model" > /dev/null 2> "$work/missing.err"
check "quantize_tensor reports llmq's error for a missing model (status 1)" $([ $? -eq 1 ] && grep -q "no-such-model" "$work/missing.err"; echo $?)

# A CUDA build must give the GPU example (the package says llmq_WITH_CUDA); where a GPU is, its 16
# greedy tokens after BOS are `llmq run --device cuda`'s (-n counts BOS).
if "$prefix/bin/llmq" --version 2>/dev/null | grep -q "CUDA: not compiled in"; then
  check "a CPU-only build has no gpu_generate" $([ ! -e "$work/shared/gpu_generate" ]; echo $?)
else
  check "a CUDA build has gpu_generate" $([ -x "$work/shared/gpu_generate" ]; echo $?)
  if nvidia-smi -L > /dev/null 2>&1; then
    got=$("$work/shared/gpu_generate" "$model" 16 2> "$work/gpu.err")
    want=$("$prefix/bin/llmq" run --device cuda --model "$model" -n 17 -t 0 --ids --ignore-eos 2> /dev/null | head -1)
    echo "gpu_generate: $got"
    echo "llmq run:     $want"
    check "gpu_generate's 16 greedy tokens are llmq run --device cuda's" $([ "$(echo "$got" | wc -w)" -eq 16 ] &&
      [ "$got" = "$want" ]; echo $?)
  else
    echo "skip gpu_generate's run: no GPU visible"
  fi
fi
echo "install_consumer: $fails failed"
[ "$fails" -eq 0 ]
