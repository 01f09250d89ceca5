"""Alertmanager webhook that plans and executes mitigations (ski-rental)."""
