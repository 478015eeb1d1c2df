# -march=native turns on AMX on these machines, and AMX instructions die with SIGILL
# (tinygemm_kernel_amx). Keep every other native extension (AVX-512 matters for prefill).
# Portable builds: CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON ...", as for llama-cpp-python.
# Include after the llama.cpp tree has been added (it needs the ggml-cpu target).
option(LLAMA_OPT_NO_AMX "compile ggml without AMX instructions" ON)
if(LLAMA_OPT_NO_AMX AND TARGET ggml-cpu AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
    include(CheckCCompilerFlag)
    check_c_compiler_flag(-mno-amx-tile LLAMA_OPT_HAS_MNO_AMX)
    if(LLAMA_OPT_HAS_MNO_AMX)
        # appended after ggml's own -march=native, so these win
        target_compile_options(ggml-cpu PRIVATE -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
        message(STATUS "ggml-cpu built without AMX")
    endif()
endif()
