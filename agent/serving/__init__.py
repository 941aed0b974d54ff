"""Serving: model registry with hot swap, the Open Inference Protocol server, probation and metrics.

Importing this package is cheap: no runtime and no numpy; import the submodules you need.
"""
