"""Streaming fail-slow detector service over Prometheus series."""
