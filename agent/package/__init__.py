"""The model package: load and check it, build one, its input plans, variants, compiled caches and labels.

Importing this package imports no runtime.
"""
