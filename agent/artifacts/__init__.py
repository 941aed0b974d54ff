"""Artifacts: signed manifests, keys, the content-addressed store and the resumable pullers.

Importing this package is cheap: `cryptography` is imported only where signatures are made or checked.
"""
