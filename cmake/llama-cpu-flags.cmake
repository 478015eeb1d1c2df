# CPU flags for ggml; include before adding the llama.cpp tree, and apply_no_amx() after.
#
# -march=native turns on AMX on these machines, and AMX instructions die with SIGILL
# (tinygemm_kernel_amx). By default we therefore enable ggml's explicit x86 switches for the
# extensions /proc/cpuinfo reports (AVX-512 included: it matters for prefill), which measured
# as fast as, or faster than, native minus AMX (docs/benchmarks.md).
# Overrides, as for llama-cpp-python: CMAKE_ARGS="-DGGML_NATIVE=ON" (native minus AMX), or
# CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON ..." (your own set, e.g. a portable build).
if(NOT DEFINED GGML_NATIVE AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64" AND EXISTS /proc/cpuinfo)
    file(STRINGS /proc/cpuinfo cpu_flags REGEX "^flags" LIMIT_COUNT 1)
    string(REGEX REPLACE "^flags[ \t]*:[ \t]*" "" cpu_flags "${cpu_flags}")
    string(REPLACE " " ";" cpu_flags "${cpu_flags}")
    set(GGML_NATIVE OFF CACHE BOOL "ggml: optimize the build for the current system" FORCE)
    # ggml switch, then the CPU flags it needs
    foreach(spec
            "GGML_SSE42:sse4_2" "GGML_AVX:avx" "GGML_AVX2:avx2" "GGML_FMA:fma" "GGML_F16C:f16c"
            "GGML_BMI2:bmi2" "GGML_AVX_VNNI:avx_vnni"
            "GGML_AVX512:avx512f,avx512cd,avx512vl,avx512dq,avx512bw" "GGML_AVX512_VBMI:avx512vbmi"
            "GGML_AVX512_VNNI:avx512_vnni" "GGML_AVX512_BF16:avx512_bf16")
        string(REPLACE ":" ";" spec "${spec}")
        list(GET spec 0 switch)
        list(GET spec 1 needed)
        string(REPLACE "," ";" needed "${needed}")
        set(have ON)
        foreach(flag IN LISTS needed)
            if(NOT flag IN_LIST cpu_flags)
                set(have OFF)
            endif()
        endforeach()
        set(${switch} ${have} CACHE BOOL "" FORCE)
        list(APPEND enabled_switches "${switch}=${have}")
    endforeach()
    message(STATUS "pyllamaopt: ggml CPU switches from /proc/cpuinfo: ${enabled_switches}")
endif()

# For GGML_NATIVE=ON builds: native minus AMX. Appended after ggml's own -march=native.
function(llama_opt_apply_no_amx)
    if(GGML_NATIVE AND TARGET ggml-cpu AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
        include(CheckCCompilerFlag)
        check_c_compiler_flag(-mno-amx-tile LLAMA_OPT_HAS_MNO_AMX)
        if(LLAMA_OPT_HAS_MNO_AMX)
            target_compile_options(ggml-cpu PRIVATE -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
            message(STATUS "pyllamaopt: ggml-cpu built native without AMX")
        endif()
    endif()
endfunction()
