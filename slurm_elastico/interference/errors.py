"""Typed errors of the interference package (all `ElasticoError`, so the CLI prints them)."""

from __future__ import annotations

from slurm_elastico.errors import ElasticoError


class MeasurementError(ElasticoError):
    """A co-location measurement file or row is wrong; names the row and column and what is allowed."""

    exit_code = 2


class ModelFileError(ElasticoError):
    """A saved predictor cannot be used: another format, schema or feature version; says which."""

    exit_code = 2


class NoGpuError(ElasticoError):
    """A measurement needs an NVIDIA GPU and driver, and NVML found none."""

    exit_code = 4
