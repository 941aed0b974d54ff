"""Generated KServe v2 / Triton gRPC stubs (scripts/gen_oip_proto.py makes them)."""
