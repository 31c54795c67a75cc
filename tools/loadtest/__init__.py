"""``python -m tools.loadtest``: a multi-process load, soak and fault test of presence with an
oracle (docs/development.md, "Load and soak test")."""
