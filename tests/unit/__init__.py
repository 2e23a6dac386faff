"""Unit tests: the pure core and each kernel mechanism alone (no test world, no sandgate run)."""
