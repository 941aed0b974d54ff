"""Qualification: measure a loaded model package on each provider in isolation, and select one with evidence.

Entry point: agent.qualify.harness.qualify(...) -> Decision. The package itself is agent.package; the child
process each row runs in is agent.isolate. Importing this package imports no runtime.
"""
