"""Workloads that run on sstore: benchmarks and demos that exercise the whole engine."""
