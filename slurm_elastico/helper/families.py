"""Where the helper finds each job's shape family: recorded by elastico-submit, or files in a directory."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import yaml

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import Family
from slurm_elastico.shapes import load_directory, parse_family
from slurm_elastico.store import Store


class FamilySource(Protocol):
    def families(self, job_ids: set[int]) -> tuple[dict[int, Family], list[str]]:
        """Families of these jobs, and one warning per family that could not be used."""
        ...


class StoreFamilies:
    """Families recorded by elastico-submit in the store."""

    def __init__(self, store: Store, gpu_memory_mib: int):
        self.store, self.gpu_memory_mib = store, gpu_memory_mib

    def families(self, job_ids: set[int]) -> tuple[dict[int, Family], list[str]]:
        if not job_ids:
            return {}, []
        marks = ",".join("?" * len(job_ids))
        rows = self.store.query(f"SELECT job_id, spec, source FROM job_family WHERE job_id IN ({marks})", sorted(job_ids))
        return _parse_all(((r["job_id"], r["spec"], r["source"] or f"job {r['job_id']}") for r in rows), self.gpu_memory_mib)


class DirectoryFamilies:
    """Families as files `<job id>.yaml` in a directory (before or besides elastico-submit)."""

    def __init__(self, directory: str | Path, gpu_memory_mib: int):
        self.dir, self.gpu_memory_mib = Path(directory), gpu_memory_mib
        if not self.dir.is_dir():
            raise ConfigError(str(self.dir), ["the families directory does not exist"])

    def families(self, job_ids: set[int]) -> tuple[dict[int, Family], list[str]]:
        found, errors = load_directory(self.dir, self.gpu_memory_mib)
        return ({j: f for j, f in found.items() if j in job_ids},
                [f"family ignored, the job is left as submitted: {e}" for e in errors])


def _parse_all(items, gpu_memory_mib: int) -> tuple[dict[int, Family], list[str]]:
    families: dict[int, Family] = {}
    warnings: list[str] = []
    for job_id, text, source in items:
        try:
            families[job_id] = parse_family(yaml.safe_load(text), source, gpu_memory_mib)
        except (ConfigError, yaml.YAMLError) as exc:
            warnings.append(f"job {job_id}: family ignored, the job is left as submitted: {exc}")
    return families, warnings

