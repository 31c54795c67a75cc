"""Benchmarks of django-live-presence (``make bench`` / ``python -m benchmarks``).

Figures are ratios measured side by side in one run, so a noisy machine affects both sides
alike. They are not tests. See benchmarks/README.md.
"""
