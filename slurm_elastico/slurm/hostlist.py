"""Slurm hostlists ("n[1-3,5]", "rack[1-2]-gpu[01-02]") to node names.

Pure string work: the gateway expands what squeue/sinfo print. Zero padding
follows the low end as written ("[08-10]" gives n08, n09, n10), as `scontrol
show hostnames` does; several bracket groups in one name give their cartesian
product, the last group varying fastest. Our own parser rather than
python-hostlist: that library is GPL-2.0-or-later (this project is Apache-2.0)
and ships no wheel; ClusterShell's NodeSet sorts names, where Slurm keeps the
order written. The unit tests hold it to what `scontrol show hostnames` prints.
"""

from __future__ import annotations

import itertools
import re

from slurm_elastico.errors import ParseError

MAX_RANGE = 100_000
"""Most names one bracket range may give: guards against a typo expanding forever."""

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """Split on commas that are outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ParseError(f"hostlist {text!r}: nested '[' is not allowed")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ParseError(f"hostlist {text!r}: ']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ParseError(f"hostlist {text!r}: '[' is never closed")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(spec: str, whole: str) -> list[str]:
    """'1-3,05' -> ['1', '2', '3', '05']; the width of the low end sets the padding."""
    out: list[str] = []
    for item in spec.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise ParseError(f"hostlist {whole!r}: {item!r} is not a number or a range like 1-4")
        lo_text, hi_text = m.group(1), m.group(2)
        lo = int(lo_text)
        hi = int(hi_text) if hi_text is not None else lo
        if hi < lo:
            raise ParseError(f"hostlist {whole!r}: range {item!r} runs backwards")
        if hi - lo >= MAX_RANGE:
            raise ParseError(f"hostlist {whole!r}: range {item!r} has more than {MAX_RANGE} names")
        # Slurm pads every number to the width of the low end as written.
        out.extend(str(n).zfill(len(lo_text)) for n in range(lo, hi + 1))
    return out


def _expand_one(item: str, whole: str) -> list[str]:
    pieces = re.split(r"(\[[^\]]*\])", item)
    choices: list[list[str]] = []
    for piece in pieces:
        if piece.startswith("["):
            choices.append(_expand_ranges(piece[1:-1], whole))
        elif piece:
            choices.append([piece])
    return ["".join(combo) for combo in itertools.product(*choices)]


def expand_hostlist(text: str) -> tuple[str, ...]:
    """All node names of a hostlist, in Slurm's order, without duplicates.

    Empty text gives (); so does "None assigned" (sacct's word for no nodes)
    and "(null)".
    """
    text = (text or "").strip()
    if not text or text in ("None assigned", "(null)", "None"):
        return ()
    try:
        return tuple(dict.fromkeys(name for item in _split_top(text) for name in _expand_one(item, text)))
    except ParseError as exc:
        raise ParseError(f"{exc}; allowed: comma-separated names, each with bracketed numbers or ranges such as "
                         "n[1-3,5] or gpu[01-02]") from None
