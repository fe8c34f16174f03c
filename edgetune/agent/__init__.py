"""Host side of the agent protocol: provisioning, jobs, results."""
