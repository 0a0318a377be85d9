"""Generated gRPC code; see proto/generate.py."""
