"""The contract: plain data (workloads, suites, records, the registry), importable without torch."""
