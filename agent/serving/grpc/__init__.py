"""The KServe v2 gRPC front of the data plane (grpcio's sync server + grpc.health.v1)."""
