"""Measuring the machine: calibration, NVML telemetry, the engine's Prometheus counters."""
