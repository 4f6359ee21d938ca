"""The runtime half of telemetry: the sampler of a task try, whose profile travels in the result envelope."""
