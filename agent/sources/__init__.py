"""Deployment sources: the ports through which desired state enters the lifecycle (inbox, MQTT)."""
