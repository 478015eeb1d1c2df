#!/usr/bin/env bash
# Fuzzing at volume (spec 000 §6.4), outside CI (the suite runs each of these with a small seeded
# or default-size run):
#
#   tools/fuzz.sh [seed]       (run from anywhere; needs the package importable, as for the tests)
#
# 1. context-hash and kv-cache-diff against the references in tests/cpp/fuzz-hash-diff.cpp:
#    $HASH_DIFF_CASES (10^6) cases each;
# 2. the persist reader on $PERSIST_CASES (10^5) mutated entries (tests/cpp/fuzz-persist.cpp);
#    both built with ASan + UBSan (any report aborts), in build/fuzz ($FUZZ_BUILD_DIR);
# 3. the JSON Schema -> GBNF converter on random schemas and the chat template sandbox on hostile
#    templates: the hypothesis tests with the "fuzz" profile, $FUZZ_EXAMPLES (10^4) examples each.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build/fuzz}
seed=${1:-1}
sanitize="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"

cmake -S "$root/tests/cpp" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="$sanitize" -DCMAKE_EXE_LINKER_FLAGS="$sanitize" > /dev/null
cmake --build "$build" --target fuzz-hash-diff fuzz-persist -j 2 > /dev/null
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1

echo "+ fuzz-hash-diff ${HASH_DIFF_CASES:=1000000} $seed" >&2
"$build/fuzz-hash-diff" "$HASH_DIFF_CASES" "$seed"
echo "+ fuzz-persist ${PERSIST_CASES:=100000} $seed" >&2
"$build/fuzz-persist" "$PERSIST_CASES" "$seed"

echo "+ pytest --hypothesis-profile=fuzz (FUZZ_EXAMPLES=${FUZZ_EXAMPLES:=10000}, seed $seed)" >&2
cd "$root"
FUZZ_EXAMPLES=$FUZZ_EXAMPLES python -m pytest -q -p no:cacheprovider --hypothesis-profile=fuzz \
    --hypothesis-seed="$seed" --hypothesis-show-statistics --durations=0 \
    tests/test_schema_fuzz.py tests/test_chat.py::test_random_hostile_templates_give_text_or_a_typed_error
