"""The one child-process runner: run a function by name in a child (fork server or a fresh interpreter), with a
timeout, a memory cap and a lifeline to the parent.
"""
