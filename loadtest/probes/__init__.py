"""White-box probes of what the broker costs, run from a checkout (not installed)."""
