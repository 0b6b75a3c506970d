"""Benchmarks: scripts that print figures. Timings are ratios from one run on one machine."""
