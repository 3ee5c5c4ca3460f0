"""The daemon roles (worker spawner, sweeper, promoter) and their shared service loop."""
