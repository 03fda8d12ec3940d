"""Kernel micro-benchmarks, kept for tuning the kernels: see bench/README.md."""
