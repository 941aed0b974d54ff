"""Qualification: load a model package, measure it on each provider in isolation, select one with evidence.

Entry points: agent.qualify.package.load_package(path) and agent.qualify.harness.qualify(...) -> Decision.
Importing this package imports no runtime.
"""
