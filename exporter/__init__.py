"""Node agent: reads shim and torch-hook rings plus NVML, serves per-rank metrics to Prometheus."""
