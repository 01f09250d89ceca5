"""The `failslow` command line: the composition root that wires core, services and testbed."""
