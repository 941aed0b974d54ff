"""The HTTP/1.1 front of the data plane (KServe v2 REST + /metrics): sockets, framing, workers, JSON and binary bodies."""
