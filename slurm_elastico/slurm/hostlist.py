"""Slurm hostlists ("n[1-3,5]", "gpu[01-02]", "a[1-2]b[3-4]") to node names, through python-hostlist.

The parsing is the library's (`hostlist.expand_hostlist`, the one HPC sites
use beside Slurm); this module only gives it the project's words: Slurm's
spellings of "no nodes" read as none, names come in Slurm's order without
duplicates, and a list the library refuses is a `ParseError` naming the list,
what is wrong and what is allowed. Zero padding follows the low end as written
("[08-10]" gives n08, n09, n10), as `scontrol show hostnames` does; several
bracket groups in one name give their cartesian product, the last group
varying fastest.
"""

from __future__ import annotations

import hostlist  # python-hostlist (absolute import: the library, not this module)

from slurm_elastico.errors import ParseError

NO_NODES = frozenset({"None assigned", "(null)", "None"})
"""What Slurm's commands print for a job without nodes (sacct: "None assigned")."""


def expand_hostlist(text: str) -> tuple[str, ...]:
    """All node names of a hostlist, in Slurm's order, without duplicates.

    Empty text gives (); so does any of `NO_NODES`. More than 100 000 names from one range is refused
    (the library's bound): a typo must not expand forever.
    """
    text = (text or "").strip()
    if not text or text in NO_NODES:
        return ()
    try:
        names = hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as exc:
        raise ParseError(f"hostlist {text!r} is not a Slurm hostlist ({exc}); allowed: comma-separated names, "
                         "each with bracketed numbers or ranges such as n[1-3,5] or gpu[01-02]") from None
    return tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
