"""Control plane: push (signed desired state), artifact_server (chunk answers), status (fleet view), rollout.

The fleet simulator, which runs real device daemons, is agent.sim.
"""
