"""Deployment lifecycle: state table, journal, A/B model slots, recovery and the orchestrator."""
