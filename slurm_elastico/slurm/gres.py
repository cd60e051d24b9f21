"""GRES and TRES strings as Slurm prints them (22.05 and 24.11 forms).

Pure string work behind the JSON parsers. The forms met on real clusters:

- request (`tres_per_node`): "gres:mps:25" (22.05), "gres/mps:10" (24.11),
  "gres:gpu:2", "gres/gpu:tesla:1", "" and "gres:" (nothing);
- per-node allocation (`gres_detail`): "mps:25(IDX:0)", "gpu:2(IDX:0-1)"
  (22.05 and 24.11 GPUs), "mps:10(10/100,0/100,0/100,0/100)" (24.11 shared
  GRES: this job's shares on each GPU of the node, out of that GPU's count);
- node configuration (`gres`): "gpu:4,mps:400", "gpu:a100:4(S:0-1)", several
  types on one node "gpu:a100:2(S:0),gpu:v100:2(S:1)";
- typed requests: "gres:gpu:a100:2" (22.05), "gres/gpu:a100:2" (24.11),
  "gres:gpu:a100" (count 1); the type is what sits between name and count.
- TRES (`tres_used`, `tres_req_str`): "cpu=2,mem=4000M,gres/mps=35".

The parentheses of the 24.11 form hold commas, so lists split only on commas
outside parentheses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_elastico.errors import ParseError
from slurm_elastico.model import GresRequest

_COUNT = re.compile(r"^(\d+)([KMGTP]?)$", re.IGNORECASE)
_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_MEM_TO_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}
_SHARE = re.compile(r"^(\d+)/(\d+)$")


@dataclass(frozen=True)
class GresItem:
    """One `name[:type][:count][(detail)]` item; `detail` is the text inside the parentheses."""

    name: str
    type: str
    count: int
    detail: str = ""


@dataclass(frozen=True)
class GpuHold:
    """A job's hold on one GPU of one node: MPS shares, or the whole GPU."""

    index: int
    shares: int
    whole: bool


def split_list(text: str) -> list[str]:
    """Split on commas outside parentheses; drop empty items."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _count(text: str, whole: str) -> int:
    m = _COUNT.match(text)
    if not m:
        raise ParseError(f"GRES {whole!r}: count {text!r} is not a whole number")
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def parse_gres_item(text: str) -> GresItem | None:
    """One GRES item; None for an empty one ("gres:" is how 22.05 prints no GRES)."""
    whole = text
    text = text.strip()
    for prefix in ("gres:", "gres/"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    # 22.05 and 24.11 print an untyped GRES in node usage as "gpu:(null):1(...)".
    text = text.replace(":(null)", "")
    detail = ""
    if "(" in text:
        if not text.endswith(")"):
            raise ParseError(f"GRES {whole!r}: text after the closing parenthesis")
        text, detail = text[: text.index("(")], text[text.index("(") + 1 : -1]
    if not text:
        return None
    parts = re.split(r"[:=]", text)
    name = parts[0]
    if not name:
        raise ParseError(f"GRES {whole!r}: no GRES name before ':'")
    if len(parts) > 1 and _COUNT.match(parts[-1]):
        return GresItem(name, ":".join(parts[1:-1]), _count(parts[-1], whole), detail)
    # No count: Slurm's default count is 1 ("gres/gpu", "gres/gpu:tesla").
    return GresItem(name, ":".join(parts[1:]), 1, detail)


def parse_gres_list(text: str | None) -> list[GresItem]:
    return [item for item in (parse_gres_item(p) for p in split_list(text or "")) if item is not None]


def parse_gres_request(text: str | None) -> GresRequest | None:
    """The GPU or MPS request per node in a `tres_per_node`/`Gres=` string; None when it asks for neither.

    Other GRES (shard, licenses) are ignored. Slurm refuses jobs asking for
    both gpu and mps, so the first of them wins.
    """
    for item in parse_gres_list(text):
        if item.name in ("gpu", "mps"):
            return GresRequest(item.name, item.count, item.type if item.name == "gpu" else "")
    return None


def gres_types(text: str | None) -> tuple[tuple[str, int], ...]:
    """A node's GPUs per type from its configured `gres`, in Slurm's order: "gpu:a100:2(S:0),gpu:v100:2" ->
    (("a100", 2), ("v100", 2)); an untyped entry counts under "" ("gpu:4" -> (("", 4),)).

    Trap: a type made of digits alone with no count ("gpu:3090") reads as an untyped count, as it reads to Slurm.
    """
    out: dict[str, int] = {}
    for item in parse_gres_list(text):
        if item.name == "gpu":
            out[item.type] = out.get(item.type, 0) + item.count
    return tuple(out.items())


def _index_list(text: str, whole: str) -> list[int]:
    """'0-1,3' -> [0, 1, 3]; 'N/A' -> []."""
    text = text.strip()
    if not text or text.upper() == "N/A":
        return []
    out: list[int] = []
    for item in text.split(","):
        lo, _, hi = item.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ParseError(f"GRES {whole!r}: GPU index {item!r} is not a number or a range")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _detail_holds(item: GresItem, whole: str) -> list[GpuHold]:
    detail = item.detail.strip()
    if detail.startswith("IDX:"):
        indices = _index_list(detail[4:], whole)
        if item.name == "gpu":
            return [GpuHold(i, 0, True) for i in indices]
        if not indices or item.count <= 0:
            return []
        # 22.05 MPS: the count is over the listed GPUs; one GPU is the rule.
        # Spread evenly, remainder on the first ones (never seen with >1 GPU).
        base, extra = divmod(item.count, len(indices))
        holds = [GpuHold(i, base + (1 if k < extra else 0), False) for k, i in enumerate(indices)]
        return [h for h in holds if h.shares > 0]
    per_gpu = detail.split(",") if detail else []
    if per_gpu and all(_SHARE.match(p.strip()) for p in per_gpu):
        # 24.11 shared GRES: position = GPU index, numerator = this job's use.
        used = [int(_SHARE.match(p.strip()).group(1)) for p in per_gpu]  # type: ignore[union-attr]
        if item.name == "gpu":
            return [GpuHold(i, 0, True) for i, n in enumerate(used) if n > 0]
        return [GpuHold(i, n, False) for i, n in enumerate(used) if n > 0]
    if not detail:
        return []
    raise ParseError(f"GRES detail {whole!r}: {detail!r} is neither 'IDX:...' nor 'used/total,...'")


def parse_gres_detail(text: str | None) -> tuple[GpuHold, ...]:
    """A job's GPUs on one node from one `gres_detail` entry; only gpu and mps count."""
    whole = text or ""
    holds: list[GpuHold] = []
    for item in parse_gres_list(whole):
        if item.name in ("gpu", "mps"):
            holds.extend(_detail_holds(item, whole))
    return tuple(holds)


def gres_counts(text: str | None) -> tuple[int, int]:
    """(GPUs, MPS shares) of a node's configured `gres` string, e.g. "gpu:4,mps:400" -> (4, 400)."""
    gpus = mps = 0
    for item in parse_gres_list(text):
        if item.name == "gpu":
            gpus += item.count
        elif item.name == "mps":
            mps += item.count
    return gpus, mps


def parse_tres(text: str | None) -> dict[str, int]:
    """A TRES string to {name: count}; `mem` in MiB ("mem=4000M" -> 4000, "16G" -> 16384)."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ParseError(f"TRES {text!r}: {item!r} is not name=value")
        value = value.strip()
        unit = value[-1:].upper()
        try:
            if unit in _MEM_TO_MIB and key == "mem":
                out[key] = int(float(value[:-1]) * _MEM_TO_MIB[unit])
            elif unit in _MEM_TO_MIB:
                out[key] = int(float(value[:-1]) * _SUFFIX[unit])
            else:
                out[key] = int(float(value))
        except ValueError:
            raise ParseError(f"TRES {text!r}: value of {key!r} is {value!r}, not a number") from None
    return out
