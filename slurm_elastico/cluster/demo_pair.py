"""One paired epoch of the demo's shadow pass, in a process of its own (`demo_shadow.PairedHelper` runs it).

    python -m slurm_elastico.cluster.demo_pair WORK [SLURMCTLD_LOG]

With the helper's locks held (`helper.service.held`), it opens the helper twice on the settings `$ELASTICO_CONFIG`
names, as `elastico sched --once` would: a shadow helper (read-only gateway, guarded runner, shadow journal) and an
acting one. Then `demo_shadow.Pairing.pair`: the shadow epoch, checked around, then the acting epoch.

The acting epoch plans on the read of Slurm the shadow epoch made (`OneRead`), then acts: what it takes is what an
acting helper decides on the state the shadow epoch saw. Read again, a job Slurm ended or started in the fraction
of a second between two epochs would have the two plan for different clusters, and the comparison would measure
that coincidence instead of shadow mode. (Recovery, when it settles a journal row, reads Slurm afresh, as always.)
An action on a job Slurm moved meanwhile is refused by Slurm and counted as not taken.

Each epoch's output goes to WORK/shadow.log or WORK/sched.log as `elastico sched --once --json` prints it; the pair
is printed as one JSON line. Exit 0; 3 when the shadow epoch failed (the reason on stderr); 1 when the pair could
not run (the helper's locks taken, bad settings).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import sys
from pathlib import Path

from slurm_elastico import config, jsonout
from slurm_elastico.cluster.demo_checks import DemoError
from slurm_elastico.cluster.demo_shadow import Pairing
from slurm_elastico.errors import ElasticoError, SlurmUnavailable

LOGS = {"shadow": "shadow.log", "act": "sched.log"}


class OneRead:
    """A gateway that keeps its last snapshot (`last`) and, when `given` is set, answers the next snapshot with it
    (once) instead of reading Slurm; everything else is the gateway's."""

    def __init__(self, gateway):
        self._gateway = gateway
        self.last = None
        self.given = None

    def snapshot(self):
        if self.given is not None:
            snap, self.given = self.given, None
            return snap
        self.last = self._gateway.snapshot()
        return self.last

    def __getattr__(self, name: str):
        return getattr(self._gateway, name)


def main(argv: list[str] | None = None) -> int:
    from slurm_elastico.helper.metrics import Metrics
    from slurm_elastico.helper.service import held, open_helper
    from slurm_elastico.slurm.gateway import gateway_from

    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        print("usage: python -m slurm_elastico.cluster.demo_pair WORK [SLURMCTLD_LOG]", file=sys.stderr)
        return 2
    work, ctld = Path(args[0]), (Path(args[1]) if len(args) > 1 and args[1] else None)
    try:
        with contextlib.ExitStack() as stack:
            cfg = config.load(None)
            stack.enter_context(held(cfg))
            logs = {mode: stack.enter_context(open(work / name, "a")) for mode, name in LOGS.items()}
            gateways: dict[str, OneRead] = {}

            def opened(mode: str):
                def around(gateway):
                    gateways[mode] = OneRead(gateway)
                    return gateways[mode]

                shadow = mode == "shadow"
                return open_helper(cfg, shadow=shadow, metrics=Metrics(mode="shadow" if shadow else ""),
                                   log=lambda level, line: print(line, file=logs[mode], flush=True), around=around)

            services = {mode: opened(mode) for mode in LOGS}

            def epoch(mode: str) -> tuple[dict | None, int]:
                if mode == "act":
                    gateways["act"].given = gateways["shadow"].last  # None when the shadow epoch read nothing
                try:
                    result = services[mode].step()
                except SlurmUnavailable as exc:
                    print(f"Slurm is unavailable; planned nothing, changed nothing: {exc}", file=logs[mode], flush=True)
                    return None, SlurmUnavailable.exit_code
                except (ElasticoError, sqlite3.Error, OSError) as exc:  # as `elastico sched` reports a failed epoch
                    print(f"error: epoch failed: {exc}", file=logs[mode], flush=True)
                    return None, 1
                print(jsonout.dumps(result.to_dict()), file=logs[mode], flush=True)
                return result.to_dict(), SlurmUnavailable.exit_code if result.outage else 0

            pair = Pairing(epoch, gateway_from(cfg).runner, ctld).pair()
    except DemoError as exc:
        print(f"{exc} (in {work})", file=sys.stderr)
        return 3
    except ElasticoError as exc:  # the locks taken, bad settings
        print(f"the pair did not run: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(dataclasses.asdict(pair)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
