"""The fleet simulator: N real DeviceAgents in one process on captured device classes."""
