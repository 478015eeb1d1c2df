#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer over the whole engine:
#
#   tools/sanitize.sh [pytest arguments]      (default: the whole suite, tests/; Python >= 3.11)
#
# 1. builds cpp/, llama.cpp and the extension with -fsanitize=address,undefined (GCC or Clang:
#    $CC/$CXX) in build/sanitize ($SANITIZE_BUILD_DIR), with the C++ unit tests and fuzz drivers;
# 2. runs the C++ units and fuzz drivers (ctest; leak detection on);
# 3. runs the Python suite with that extension and the sanitizer runtimes preloaded (LD_PRELOAD:
#    Python itself is not instrumented, and ASan must be loaded first), PYTHONMALLOC=malloc so that
#    Python's own allocations are checked too, leak detection off (the interpreter does not free
#    everything at exit), hypothesis's timing checks off (profile 'sanitize', tests/conftest.py).
#    Child processes (the server the tests start) inherit all of it.
# Every report is written to build/sanitize/reports/ (ASan: asan.PID, UBSan: ubsan.PID) and printed
# at the end; the script fails if there is any, or if a test fails. Known reports of upstream code
# are suppressed, each with its reason, in tools/sanitize-ubsan.supp.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${SANITIZE_BUILD_DIR:-$root/build/sanitize}
python=${PYTHON:-python3}
sanitize="-fsanitize=address,undefined -fno-omit-frame-pointer"

if [ ! -f "$build/build.ninja" ]; then
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSKBUILD=ON \
        -DSKBUILD_PROJECT_VERSION_FULL=0.1.0 -DPython_EXECUTABLE="$(command -v "$python")" \
        -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" -DLLAMA_OPT_BUILD_TESTS=ON \
        -DCMAKE_C_FLAGS="$sanitize" -DCMAKE_CXX_FLAGS="$sanitize" \
        -DCMAKE_EXE_LINKER_FLAGS="$sanitize" -DCMAKE_SHARED_LINKER_FLAGS="$sanitize" \
        -DCMAKE_MODULE_LINKER_FLAGS="$sanitize"
fi
cmake --build "$build" -j "${SANITIZE_JOBS:-2}"

reports="$build/reports"
rm -rf "$reports"
mkdir -p "$reports"
ubsan_common="print_stacktrace=1:suppressions=$root/tools/sanitize-ubsan.supp"
export UBSAN_OPTIONS="$ubsan_common:log_path=$reports/ubsan"

echo "+ C++ units and fuzz drivers (ctest)" >&2
ASAN_OPTIONS="log_path=$reports/asan:detect_leaks=1" ctest --test-dir "$build" --output-on-failure || units_failed=1

# The package with the sanitized extension, outside the checkout (whose pyllamaopt/ holds another
# build), in a virtual environment of its own on top of the running Python's packages, with the
# `pyllamaopt` command the CLI tests run; PYTHONSAFEPATH keeps the current directory off sys.path,
# in child processes too.
stage="$build/stage"
rm -rf "$stage"
mkdir -p "$stage"
cp -r "$root/pyllamaopt" "$stage/"
rm -f "$stage"/pyllamaopt/_core*.so
cp "$build"/_core*.so "$stage/pyllamaopt/"
venv="$build/venv"
[ -x "$venv/bin/python" ] || "$python" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n%s\n' "$stage" "$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > "$site/sanitize.pth"
printf '#!%s\nimport sys\nfrom pyllamaopt.cli import main\nsys.exit(main())\n' "$venv/bin/python" > "$venv/bin/pyllamaopt"
chmod +x "$venv/bin/pyllamaopt"
cd "$root"
runtimes=$("${CXX:-c++}" -print-file-name=libasan.so)
case "$("${CXX:-c++}" --version)" in
    *clang*) runtimes=$("${CXX:-c++}" -print-file-name=libclang_rt.asan-x86_64.so) ;;
    *) runtimes="$runtimes $("${CXX:-c++}" -print-file-name=libubsan.so)" ;;
esac

echo "+ Python suite under ASan + UBSan: pytest ${*:-tests}" >&2
(
    export LD_PRELOAD="$runtimes" PYTHONSAFEPATH=1 PYTHONMALLOC=malloc
    # allocator_may_return_null: tests ask for impossible sizes and expect a typed error, not an abort
    export ASAN_OPTIONS="log_path=$reports/asan:detect_leaks=0:allocator_may_return_null=1"
    if [ $# -eq 0 ]; then set -- tests; fi
    "$venv/bin/python" -m pytest -p no:cacheprovider --hypothesis-profile=sanitize "$@"
) || suite_failed=1

found=$(find "$reports" -type f | sort)
for f in $found; do
    echo "=== $f" >&2
    cat "$f" >&2
done
echo "sanitizer reports: $(echo "$found" | grep -c . || true); C++ units: ${units_failed:+FAILED}${units_failed:-passed};" \
     "Python suite: ${suite_failed:+FAILED}${suite_failed:-passed}" >&2
[ -z "$found" ] && [ -z "${units_failed:-}" ] && [ -z "${suite_failed:-}" ]
