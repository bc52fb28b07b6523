"""Benchmarks: each script compares two runs taken side by side and writes JSON plus a markdown table."""
