"""One run of the helper as a service: its working parts, opened in a safe order, and one epoch with its metrics.

`held` is what a helper that acts (or shadows) holds for its whole life (a
dry run holds nothing: it changes nothing, so it may look while the helper
runs; a shadow helper holds the same locks as an acting one, as it records
the jobs' progress in the same store).
`open_service` reads everything a bad input can fail (the families directory,
the interference model and the measurements it was trained on) before it
opens the store, so a refused start writes nothing; then the store, the
journal (none in a dry run: it changes nothing) and the progress observer.
In shadow mode (`shadow=True`) the gateway is wrapped in a
`shadow.ReadOnlyGateway`, the journal is the shadow journal and the observer
judges nothing (see `helper.shadow`); after each shadow epoch `step` checks
that nothing was refused on the way (a refusal some caller caught is still a
defect: `ShadowRefused`). `commands`, the gateway's `GuardedRunner` when
there is one, counts the commands that changed Slurm (`slurm_changes`).
`open_helper` opens the service over the live cluster (`elastico sched`, the
demo's paired epochs), its Slurm commands through a `GuardedRunner`.
`Service.step` runs one epoch and counts it in the metrics (an outage or a
failure too, before the error goes on to the caller), then rewrites the
metrics file when there is one. Printing and exit codes are the CLI's.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from slurm_elastico.config import Settings
from slurm_elastico.errors import ConfigError, ElasticoError, ShadowRefused, SlurmUnavailable
from slurm_elastico.helper.epoch import EpochResult, Gateway, run_once
from slurm_elastico.helper.families import DirectoryFamilies, FamilySource, ScriptFamilies, ScriptReader
from slurm_elastico.helper.journal import Journal
from slurm_elastico.helper.lock import helper_lock
from slurm_elastico.helper.metrics import Metrics, observed_slowdowns, write_file
from slurm_elastico.helper.observe import SOURCE
from slurm_elastico.helper.observer import ProgressObserver
from slurm_elastico.helper.private import require_private
from slurm_elastico.helper.shadow import ReadOnlyGateway, ShadowJournal
from slurm_elastico.interference import load_model
from slurm_elastico.interference.adapt_online import OnlineAdapted
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.interference.errors import MeasurementError
from slurm_elastico.interference.measurements import read_csv
from slurm_elastico.planner.slowdown import UNCALIBRATED_GAIN_MARGIN
from slurm_elastico.shapes.typed import figures_by_type
from slurm_elastico.slurm.conf import read_cluster_name
from slurm_elastico.slurm.gateway import gateway_from
from slurm_elastico.slurm.readonly import GuardedRunner
from slurm_elastico.store import Store

Log = Callable[[str, str], None]
"""Where the service says something: `log(level, line)`, level one of "info", "warning", "error"."""


@contextmanager
def held(settings: Settings) -> Iterator[None]:
    """Umask 077 (the helper's state is private: `helper.private`), a private state directory, and the cluster's
    and the state directory's locks, until the block ends; `HelperBusy` naming the other helper when taken."""
    previous = os.umask(0o077)
    try:
        require_private(settings.state_dir)
        with helper_lock(read_cluster_name(settings.slurm.conf), settings.state_dir):
            yield
    finally:
        os.umask(previous)


class HelperGateway(Gateway, ScriptReader, Protocol):
    """What the helper needs of Slurm: the epoch's gateway, and the jobs' batch scripts (their families)."""


@dataclass
class Service:
    """The parts one helper run holds for its whole life (see the module's docstring)."""

    settings: Settings
    gateway: HelperGateway
    families: FamilySource
    model: SlowdownModel
    journal: Journal | ShadowJournal | None
    observer: ProgressObserver
    store: Store
    metrics: Metrics
    log: Log
    dry_run: bool = False
    metrics_file: str | None = None
    shadow: bool = False
    commands: GuardedRunner | None = None

    def publish(self) -> None:
        """Rewrite the metrics file, if any; a failure is logged, never raised: the metrics are a view, and their
        file failing must not stop scheduling."""
        if self.metrics_file:
            try:
                write_file(self.metrics, self.metrics_file)
            except OSError as exc:
                self.log("error", f"error: metrics not written to {self.metrics_file}: {exc.strerror}")

    def step(self) -> EpochResult:
        """One epoch, counted in the metrics; `SlurmUnavailable` and other failures are counted, then raised."""
        started = time.monotonic()
        changes = self.commands.changes if self.commands is not None else None
        refused = self._refused()
        try:
            result = run_once(self.gateway, self.settings, self.families, self.model, self.journal, time.time(),
                              dry_run=self.dry_run, observer=self.observer, shadow=self.shadow)
            if self._refused() != refused:  # caught on the way: still a defect, and said so
                raise ShadowRefused(f"shadow mode: this epoch asked to change Slurm and was refused: "
                                    f"{self._refused()[len(refused):]}; nothing was changed")
        except SlurmUnavailable:
            self.metrics.outage(time.monotonic() - started, time.time())
            self.publish()
            raise
        except (ElasticoError, sqlite3.Error, OSError):
            self.metrics.failed(time.monotonic() - started, time.time())
            self.publish()
            raise
        if changes is not None:
            result = dataclasses.replace(result, slurm_changes=self.commands.changes - changes)  # type: ignore[union-attr]
        if self.shadow:
            result = dataclasses.replace(result, warnings=(*result.warnings, *self._left_open()))
        self.metrics.epoch(result, time.monotonic() - started, observed_slowdowns(self.store, SOURCE), time.time())
        self.publish()
        return result

    def _left_open(self) -> list[str]:
        """In shadow mode, every epoch: the acting helper's journal rows still open (a job it may have left held)."""
        rows = Journal(self.store).unsettled()  # read, never settled here: recovery is the acting helper's
        if not rows:
            return []
        jobs = ", ".join(str(j) for j in sorted({a.job_id for _, a in rows}))
        return [f"the acting helper left {len(rows)} journal row(s) open (jobs {jobs}); shadow mode does not settle "
                "them: a job it requeue-held stays held until an acting epoch runs (`elastico sched --once`)"]

    def _refused(self) -> list:
        """Every call and command refused so far (the read-only gateway's and the guarded runner's)."""
        return [*getattr(self.gateway, "refused", ()), *(self.commands.refused if self.commands is not None else ())]


def open_service(settings: Settings, gateway: HelperGateway, *, families_dir: str | None, dry_run: bool,
                 metrics: Metrics, metrics_file: str | None, log: Log, shadow: bool = False,
                 commands: GuardedRunner | None = None) -> Service:
    """The helper's parts for `settings`; every bad input is refused before the store is opened (`ConfigError`
    naming `interference.reference` for measurements that do not read). `shadow`: see the module's docstring;
    `commands`: the runner inside `gateway`, when it is a `GuardedRunner` (it must refuse changes in shadow mode)."""
    cfg = settings
    if shadow and dry_run:
        raise ValueError("a dry run and shadow mode exclude each other")
    if shadow and (commands is None or commands.allow_changes):
        raise ValueError("shadow mode needs a runner that refuses changes (GuardedRunner(allow_changes=False))")
    if shadow:
        gateway = ReadOnlyGateway(gateway)  # type: ignore[assignment]
    figures = figures_by_type(getattr(cfg.gpu, "types", None))  # declared specs of types the public table lacks
    directory = DirectoryFamilies(families_dir, cfg.gpu.memory_mib, cfg.gpu.type, figures) if families_dir else None
    model = load_model(cfg.interference.model)
    reference = []
    if cfg.interference.reference:
        if not cfg.interference.model:
            log("info", "note: interference.reference is set but interference.model is empty: observed "
                "slowdowns are recorded, no model is refined")
        try:
            reference = read_csv(cfg.interference.reference)
        except MeasurementError as exc:
            raise ConfigError("interference.reference", [f"{exc} (the measurement CSV the model was trained on)"]) from None
    store = Store(cfg.store_path)
    if directory is not None:
        directory.store = store  # its jobs' speeds measured per GPU type
    families = directory or ScriptFamilies(store, gateway, cfg.gpu.memory_mib, anchor=cfg.gpu.type, figures=figures,
                                           read_budget_s=cfg.helper.script_read_budget_s)
    journal = None if dry_run else ShadowJournal(store) if shadow else Journal(store)
    if cfg.interference.adapt_online and model is not None:
        # probing (interference.probe_budget): an unmeasured pair at its prediction over the untrained model's
        # error, as the simulated new cluster probes (`sim.new_cluster`)
        optimism = UNCALIBRATED_GAIN_MARGIN if cfg.interference.probe_budget > 0 else 0.0
        model = OnlineAdapted(model, cfg.gpu.type, untrained_margin=UNCALIBRATED_GAIN_MARGIN, probe_optimism=optimism)
        reference = []  # one way to learn from this cluster's pairs: the adaptation
    observer = ProgressObserver(store, cfg.gpu.type, model, cfg.interference.model, reference, shadow=shadow,
                                probe_budget=cfg.interference.probe_budget)
    return Service(cfg, gateway, families, model, journal, observer, store, metrics, log, dry_run, metrics_file,
                   shadow, commands)


def open_helper(cfg: Settings, *, shadow: bool, dry_run: bool = False, families_dir: str | None = None,
                metrics: Metrics, metrics_file: str | None = None, log: Log, around=None) -> Service:
    """The helper's service over the live cluster, its Slurm commands through a `GuardedRunner` that refuses
    changes unless it acts. `around(gateway)`, when given, returns the gateway the service uses instead (the demo's
    paired epochs plan on one read of Slurm: `cluster.demo_pair`)."""
    commands = None

    def guard(runner):
        nonlocal commands
        commands = GuardedRunner(runner, allow_changes=not shadow and not dry_run)
        return commands

    gateway = gateway_from(cfg, wrap=guard)
    return open_service(cfg, around(gateway) if around is not None else gateway, families_dir=families_dir,
                        dry_run=dry_run, metrics=metrics, metrics_file=metrics_file, log=log, shadow=shadow,
                        commands=commands)
