"""Fixtures for the store tests: `fault_proxy`, a fault-injecting proxy in front of `s3_server`
(defined in tests/s3_fault_proxy.py so tests elsewhere can import it the same way)."""
from s3_fault_proxy import fault_proxy  # noqa: F401  (a fixture, registered by being imported here)
