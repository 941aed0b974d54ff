"""The on-device conformance pytest suite (run it with `pytest hwtests/` on the device)."""
