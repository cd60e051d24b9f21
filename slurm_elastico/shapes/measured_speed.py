"""A family's speeds after what the job itself measured: the helper's and the simulator's one rule.

A family's throughputs start as estimates (`shapes.estimate`) or the user's
declared figures, and their errors are mostly the job's own: the same model
hints mis-size every shape of it alike. So once the job has run a shape
alone, what its progress showed (`measured`: shape name -> work per second)
is that shape's figure, and every other shape of the job moves by the same
factor: the geometric mean of measured over estimated on the measured shapes.
The ratios between its shapes stay the estimate's until the job runs them.

A shape at another global batch (goodput mode) is measured in its figure's
units: the observer turns the goodput the job showed there into the figure
at the noise scale it reported (`shapes.goodput.to_figure`), and the figures
are priced by their statistical efficiency afterwards (`shapes.goodput`). So
a job that left its submitted batch still corrects its estimate's error.
Typed shapes (`<shape>@<type>`) are left alone: across GPU types the same
rule is `shapes.type_speed`'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from slurm_elastico.model import Family


def refined(fam: Family, measured: Mapping[str, float]) -> Family:
    """`fam` with each measured shape at its measured speed and the others scaled by the measured/estimated factor;
    `fam` itself when nothing usable was measured (no such shape, a rate not finite and positive, typed shapes)."""
    known = {s.name: measured[s.name] for s in fam.shapes
             if s.name in measured and "@" not in s.name and s.throughput > 0 and 0 < measured[s.name] < math.inf}
    if not known:
        return fam
    factor = math.exp(sum(math.log(r / fam.shape(n).throughput) for n, r in known.items()) / len(known))
    shapes = tuple(dataclasses.replace(s, throughput=known.get(s.name, s.throughput * factor)) for s in fam.shapes)
    return dataclasses.replace(fam, shapes=shapes)
