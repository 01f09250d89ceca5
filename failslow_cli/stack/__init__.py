"""The whole failslow stack started for real on one machine: used by `failslow demo`, the integration tests
and the alerting benchmark.

`processes` starts Prometheus, Alertmanager and Redis (Debian binaries) from the repo's own configs on free
loopback ports; `alert_path` wires a testbed job, the exporter, the detector and a stand-in remediator
webhook to them. The services are started as processes (`failslow exporter`, `failslow detector`), never
imported, so the import boundaries between services hold.
"""
