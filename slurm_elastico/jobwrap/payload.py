"""The payload of the batch script elastico-submit generates (`jobwrap.script`): what each (re)start of the job needs.

The user's script, its arguments, the family spec and the wrapper's settings
travel as JSON inside base64, so no user string is ever parsed by a shell or
by Python's tokenizer, and a requeue replays them without a shared filesystem.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import MPS_SHARES_PER_GPU

PAYLOAD_VERSION = 1


@dataclass(frozen=True)
class Payload:
    """What every (re)start of the job needs, carried inside the batch script (no shared filesystem assumed)."""

    script: bytes
    script_name: str
    args: tuple[str, ...]
    family_spec: str
    family_source: str
    gpu_memory_mib: int
    grace_s: float
    signal_lead_s: int
    slurm_conf: str = ""
    shares_per_gpu: int = MPS_SHARES_PER_GPU
    """Slurm's MPS shares per GPU at the site (`gpu.shares_per_gpu`): how the job reads its held share."""
    gpu_types: tuple[tuple[str, int], ...] = ()
    """(type, memory MiB) of each GPU type of a cluster of several (`gpu.types`), so that elastico-run knows the
    typed shapes (`<shape>@<type>`) the helper names; () on a one-type cluster."""
    type_limit: tuple[str, ...] = ()
    """The GPU types the job's own request named (`--gres=gpu:a100:2`): its family is limited to them."""
    type_like: tuple[tuple[str, str], ...] = ()
    """(type, known type) for each type the settings declare `like:` one the public table knows (`gpu.types.TYPE
    .like`): elastico-run needs its figures to know the type's shapes as the helper does."""

    def encode(self) -> str:
        data = {
            "version": PAYLOAD_VERSION,
            "script": base64.b64encode(self.script).decode("ascii"),
            "script_name": self.script_name,
            "args": list(self.args),
            "family_spec": self.family_spec,
            "family_source": self.family_source,
            "gpu_memory_mib": self.gpu_memory_mib,
            "grace_s": self.grace_s,
            "signal_lead_s": self.signal_lead_s,
            "slurm_conf": self.slurm_conf,
            "shares_per_gpu": self.shares_per_gpu,
            "gpu_types": [list(t) for t in self.gpu_types],
            "type_limit": list(self.type_limit),
            "type_like": [list(t) for t in self.type_like],
        }
        text = json.dumps(data, ensure_ascii=True, sort_keys=True)
        return base64.b64encode(text.encode("ascii")).decode("ascii")

    @classmethod
    def decode(cls, blob: str) -> Payload:
        try:
            data = json.loads(base64.b64decode(blob.encode("ascii"), validate=True))
            if data.get("version") != PAYLOAD_VERSION:
                raise ConfigError("embedded payload", [f"version {data.get('version')!r}; this elastico-run reads {PAYLOAD_VERSION}"])
            return cls(
                script=base64.b64decode(data["script"], validate=True),
                script_name=str(data["script_name"]),
                args=tuple(str(a) for a in data["args"]),
                family_spec=str(data["family_spec"]),
                family_source=str(data["family_source"]),
                gpu_memory_mib=int(data["gpu_memory_mib"]),
                grace_s=float(data["grace_s"]),
                signal_lead_s=int(data["signal_lead_s"]),
                slurm_conf=str(data.get("slurm_conf", "")),
                shares_per_gpu=int(data.get("shares_per_gpu", MPS_SHARES_PER_GPU)),
                gpu_types=tuple((str(t), int(m)) for t, m in data.get("gpu_types", [])),
                type_limit=tuple(str(t) for t in data.get("type_limit", [])),
                type_like=tuple((str(t), str(k)) for t, k in data.get("type_like", [])),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError("embedded payload", [f"unreadable ({type(exc).__name__}: {exc}); was it made by elastico-submit?"]) from None
