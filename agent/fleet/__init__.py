"""Control plane: push (signed desired state), artifact_server (chunk answers), status (fleet view).

rollout and simulator live beside these and are written separately.
"""
