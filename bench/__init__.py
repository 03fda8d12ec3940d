"""Benchmarks a maintainer reruns: see bench/README.md. Run them as modules from the repository root."""
