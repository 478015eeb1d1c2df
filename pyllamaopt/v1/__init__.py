"""Generated from proto/pyllamaopt/v1/runtime.proto by grpcio-tools (committed: see docs/serve.md,
"gRPC"; tests/test_grpc.py checks they are current). Regenerate from the repository's root with

    python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. \
        proto/pyllamaopt/v1/runtime.proto
"""
