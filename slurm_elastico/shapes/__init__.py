"""Shape families: a job's equivalent configurations, from a YAML spec to a pruned `Family`.

`load_family(path, gpu_memory_mib)` is the one call most code needs; see
`spec` for the file format, `estimate` for the model used where no numbers
are declared or profiled, `solo` for what the interference model sees. On a
cluster of several GPU types pass `gpu_types` (type -> memory MiB): the shapes
are then enumerated per type (`typed`), their speeds scaled between types by
`type_speed`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any


from slurm_elastico.inputs import read_yaml
from slurm_elastico.errors import ConfigError
from slurm_elastico.model import Family
from slurm_elastico.shapes.enumerate import build_family, enumerate_shapes, pareto
from slurm_elastico.shapes.shape_key import shape_key
from slurm_elastico.shapes.solo import solo_profile
from slurm_elastico.shapes.spec import Declared, FamilySpec, parse_spec, shape_name
from slurm_elastico.shapes.typed import Measured, build_typed_family

__all__ = ["Declared", "FamilySpec", "build_family", "build_typed_family", "enumerate_shapes", "family_of",
           "load_directory", "load_family", "parse_family", "pareto", "parse_spec", "shape_name", "solo_profile"]


def family_of(spec: FamilySpec, gpu_memory_mib: int, profiles: Mapping[str, Declared] | None = None, *,
              gpu_types: Mapping[str, int] | None = None, measured: Measured | None = None,
              anchor: str | None = None, figures: Mapping[str, Mapping[str, object]] | None = None,
              shared: dict[Hashable, Family] | None = None) -> Family:
    """The spec's `Family`: per GPU type when `gpu_types` (type -> memory MiB) names any, else for one memory.

    `figures`: declared specs of types the public table does not know (`gpu_types.resolve`). `shared`: families
    built so far by the caller, by `shape_key`; a spec whose key is there takes that family's shapes and default
    with its own work, floor and name (a family that fails to build is not kept: its error names this spec)."""
    def build() -> Family:
        if gpu_types:
            return build_typed_family(spec, gpu_types, profiles, measured, anchor, figures)
        return build_family(spec, gpu_memory_mib, profiles)

    if shared is None:
        return build()
    key = shape_key(spec, gpu_memory_mib, profiles, gpu_types, measured, anchor, figures)
    if key not in shared:
        shared[key] = build()
        return shared[key]
    return dataclasses.replace(shared[key], total_work=spec.work, throughput_floor=spec.throughput_floor,
                               name=spec.name)


def parse_family(data: Any, source: str, gpu_memory_mib: int, profiles: Mapping[str, Declared] | None = None, *,
                 gpu_types: Mapping[str, int] | None = None, measured: Measured | None = None,
                 anchor: str | None = None, figures: Mapping[str, Mapping[str, object]] | None = None,
                 shared: dict[Hashable, Family] | None = None) -> Family:
    """A `Family` from parsed YAML; raises one `ConfigError` with every problem. `shared`: as `family_of`'s."""
    return family_of(parse_spec(data, source), gpu_memory_mib, profiles, gpu_types=gpu_types, measured=measured,
                     anchor=anchor, figures=figures, shared=shared)


def load_family(path: str | os.PathLike, gpu_memory_mib: int, profiles: Mapping[str, Declared] | None = None, *,
                gpu_types: Mapping[str, int] | None = None, anchor: str | None = None,
                figures: Mapping[str, Mapping[str, object]] | None = None, measured: Measured | None = None) -> Family:
    """A `Family` from a spec file; unreadable or invalid files raise `ConfigError` naming the file."""
    return parse_family(read_yaml(path, "family file"), str(path), gpu_memory_mib, profiles, gpu_types=gpu_types,
                        anchor=anchor, figures=figures, measured=measured)


def load_directory(path: str | os.PathLike, gpu_memory_mib: int, *, gpu_types: Mapping[str, int] | None = None,
                   anchor: str | None = None, figures: Mapping[str, Mapping[str, object]] | None = None,
                   measured: Mapping[int, Measured] | None = None) -> tuple[dict[int, Family], list[ConfigError]]:
    """Families from `<job_id>.yaml` files in a directory, and the errors of the files that failed.

    A bad spec must not stop the epoch for every other job, so errors are
    returned, not raised; files whose stem is not a job id are ignored.
    """
    families: dict[int, Family] = {}
    errors: list[ConfigError] = []
    for f in sorted(Path(path).glob("*.y*ml")):
        if not f.stem.isdigit():
            continue
        try:
            families[int(f.stem)] = load_family(f, gpu_memory_mib, gpu_types=gpu_types, anchor=anchor, figures=figures,
                                                measured=(measured or {}).get(int(f.stem)))
        except ConfigError as exc:
            errors.append(exc)
    return families, errors
