"""The I/O around `helper.observe`: report files in; readings, solo rates and observations in the store.

Before planning, the epoch's `ProgressObserver` reads the running jobs'
progress reports: the work they have done goes to the planner, each job's
family moves to the speeds it measured alone (`shapes.measured_speed`), and the
slowdowns they show next to each other go to the store's `colocation` table
and, with a trained predictor and its reference data, refine it online
(`interference.online`).

In shadow mode (`shadow=True`) readings, solo rates and pair samples are
recorded as they really are, and nothing is judged (see `__init__`).

A model adapting online (`interference.adapt_online.OnlineAdapted`, `interference.adapt_online: true`) is given
every pair this store holds of the cluster's GPU type when the observer starts, and each new observation. With
`interference.probe_budget` the observer keeps the probe ledger (`interference.probe_budget`, the store's
`probe_ledger` row) and sets the model's `probing` for the epoch: pairs never measured on this type are tried
at the model's word while the probes' time stays within the budget.

Probe and revert (`interference.probe`): before a pair's side-by-side time is
spent on an observation, `judge_pairings` judges it against the jobs' floors
and the model's gain margin. A pair that did not pay is refused (`refusals`,
kept in the store's `pair_refusal` table between runs, so a helper run once
per epoch remembers them) and listed in `reverted` for the epoch to undo
(`helper.revert`); the epoch plans with `refusals.model(model, now)`.

A job that joined its partner straight from the queue has no solo speed at its shape: its pair is judged the same
way against the best reference there is, its family's figure for the shape (declared or estimated, rescaled to the
GPU type, moved by what the job measured at its other shapes: the speed the planner believed when it paired them,
`observe.estimated_solo`). A family's throughput floor is a speed, so that part of the verdict (the job below its
floor) does not depend on the figure; the gain rule does, by the figure's error. Its first judgement is charged to
the probe ledger like a first measurement while the model does not know the pair (once: a pair kept after it is
sharing that paid as far as anyone can tell, not a probe, and a queue-started job may never run alone at that
shape to make it an observation), and the pair is undone the epoch it shows a loss; but it is no observation: the adapting model and the store's `colocation` table get the pair only
once the job has run alone at that shape, as before, over the pair's whole time side by side. A ratio against a
figure carries the figure's error (a declared speed, or one scaled from another GPU type, is often tens of per cent
off), and the adapting model takes every observation as the truth (a pair measured is predicted at its
measurement, margin 0, and no longer a probe), so that error would become the model's on this type, unseen. The
time judged against a figure is kept in the store (`pair_judged`) so the next judgement is of new time only.
"""

from __future__ import annotations

import json
import math
import time

from slurm_elastico.errors import ElasticoError
from slurm_elastico.helper import job_work
from slurm_elastico.helper.families import FamilySource
from slurm_elastico.helper.observe import (MIN_PAIR_S, SOURCE, Observation, Reading, estimated_solo, merge_solo,
                                           observe, pair_observations, unjudged, with_measured)
from slurm_elastico.interference.base import SlowdownModel
from slurm_elastico.interference.probe import Refusals, Verdict, judge_pairings
from slurm_elastico.interference.probe_budget import Ledger
from slurm_elastico.interference.measurements import Colocation, load_rows, save_to_store
from slurm_elastico.model import Counters, Family, Snapshot
from slurm_elastico.runtime.counters import FIELDS as COUNTER_FIELDS
from slurm_elastico.runtime.counters import counters_path, read_counters
from slurm_elastico.runtime.progress import read_job_reports
from slurm_elastico.shapes import goodput
from slurm_elastico.shapes.measured_speed import refined
from slurm_elastico.shapes.solo import solo_profile
from slurm_elastico.store import Store

REFINE_BATCH = 5
"""Observations to gather before refining the predictor again (a long co-location gives one every 10 s or so)."""
REPLAY = 2000
"""Observed rows kept in the online learner's replay (besides its whole reference data)."""
REFUSAL_TABLE = "CREATE TABLE IF NOT EXISTS pair_refusal (id INTEGER PRIMARY KEY, body TEXT NOT NULL)"
"""The refused pairs of solo profiles, one `Refusals.to_list` row (JSON) each."""
LEDGER_TABLE = ("CREATE TABLE IF NOT EXISTS probe_ledger (gpu_type TEXT PRIMARY KEY, gpu_s REAL NOT NULL, "
                "probe_gpu_s REAL NOT NULL, last REAL)")
"""The probe ledger (`interference.probe_budget.Ledger`) of each GPU type."""
JUDGED_TABLE = ("CREATE TABLE IF NOT EXISTS pair_judged (job_id INTEGER NOT NULL, shape TEXT NOT NULL, "
                "partner INTEGER NOT NULL, partner_shape TEXT NOT NULL, work REAL NOT NULL, seconds REAL NOT NULL, "
                "PRIMARY KEY (job_id, shape, partner, partner_shape))")
"""Per direction of a `pair_rate` row, the (work, seconds) it had when last judged against a family's figure."""


def gain_margin(model: SlowdownModel | None) -> float:
    """The gain a shared GPU must show: the model's gain margin (its admission margin where it has none); 0 without one."""
    if model is None:
        return 0.0
    return float(getattr(model, "gain_margin", getattr(model, "admission_margin", 0.0)))


class ProgressObserver:
    """The I/O around `observe.observe`: report files in, readings, solo rates and observations in the store.

    With `model` a trained predictor (it has `fine_tune`) and `reference` its
    training observations, every `refine_batch` new observations refine the
    model in place (`interference.online.refine`: held out by row id, drift
    judged against the model's first recorded reference error) and, if the
    update is kept, replace `model_path` atomically; if saving fails the
    weights go back too. Every attempt is a `model_update` row.
    """

    def __init__(self, store: Store, gpu_type: str, model: SlowdownModel | None = None, model_path: str = "",
                 reference: list | None = None, refine_batch: int = REFINE_BATCH, shadow: bool = False,
                 probe_budget: float = 0.0):
        self.store, self.gpu_type = store, gpu_type
        self.probe_budget = probe_budget
        """`interference.probe_budget`: with a model adapting online, the share of the type's GPU time probes may
        take (0: the model is never told to probe)."""
        self.budgeted = probe_budget > 0 and hasattr(model, "probing")
        """Whether the observer keeps the probe ledger and tells the model when it may probe."""
        self.shadow = shadow
        """Shadow mode (`helper.shadow`): the jobs' real progress is recorded, but no pairing is judged, no refusal
        or revert recorded and the model not refined: those follow from the acting helper's own co-locations
        and undoing; the pairs' samples stay for the acting helper."""
        self.model, self.model_path, self.reference = model, model_path, reference or []
        self.refine_batch = refine_batch
        store.execute(REFUSAL_TABLE)
        store.execute(LEDGER_TABLE)
        store.execute(JUDGED_TABLE)
        try:
            self.refusals = Refusals.from_list([json.loads(r["body"]) for r in
                                                store.query("SELECT body FROM pair_refusal ORDER BY id")])
        except ValueError as exc:
            raise ElasticoError(f"the store's pair_refusal table: {exc}; allowed: rows the helper wrote "
                                "(delete the table's rows to forget every refusal)") from None
        self.reverted: list[Verdict] = []
        """The pairs this epoch's call judged not to pay (for the epoch to undo, `helper.revert`)."""
        if hasattr(model, "observe"):  # a model adapting online (`interference.adapt_online`): the pairs kept so far
            model.observe([o for _, o in load_rows(store, gpu_type, SOURCE)])

    def __call__(self, snapshot: Snapshot, families: dict[int, Family], dry_run: bool,
                 source: FamilySource | None = None) -> tuple[dict[int, float], dict[int, Family], list[str]]:
        """(work done per job, the families with measured shapes, notes) for this epoch; records what it learned.

        `source` gives the families of jobs that left the queue with a pair still open (see `_resolve`).
        """
        self.reverted = []
        mine = [j for j in snapshot.jobs if j.job_id in families]
        reports, notes = read_job_reports(mine)
        counters, counter_notes = read_job_reports(mine, read_counters, counters_path)
        notes += counter_notes
        previous = {r["job_id"]: Reading(r["done"], r["updated"], r["restarts"], r["context"], r["since"])
                    for r in self.store.query("SELECT * FROM progress_reading")}
        obs = observe(snapshot, families, reports, previous, counters)
        if not dry_run:
            self._record(snapshot, obs)
            job_work.record(self.store, mine, reports)
        measured = {(r["job_id"], r["shape"]): Counters(*(math.nan if r[f] is None else r[f] for f in COUNTER_FIELDS))
                    for r in self.store.query("SELECT * FROM solo_counters")}
        families = with_measured(families, measured)
        # what each job measured alone moves its family's speeds (`shapes.measured_speed`; typed shapes: `type_speed`)
        families = self._refined(families)
        figures = families  # each shape's solo speed in the units progress is counted in (`goodput.to_figure`)
        # goodput mode: each adaptive job's other batches at the noise scale it measured (`shapes.goodput`)
        noise = job_work.noise_scales(self.store, families, reports)
        families = goodput.priced(families, noise)
        if dry_run:
            if self.budgeted:
                self.model.probing = self._ledger().allows(self.probe_budget)  # type: ignore[union-attr]
            return obs.progress, families, notes
        found, charged = ([], []) if self.shadow else self._resolve(families, figures, measured, source, notes,
                                                                     snapshot.taken_at, noise)
        if snapshot.nodes:
            self._forget({j.job_id for j in snapshot.jobs})
            notes += job_work.close_departed(self.store, {j.job_id for j in snapshot.jobs})
        else:
            notes.append("the cluster listed no node: nothing learned is forgotten this epoch")
        if self.budgeted:
            notes.append(self._probe_budget(snapshot, charged))
        if found:
            save_to_store(self.store, found)
            if hasattr(self.model, "observe"):
                self.model.observe(found)  # every probe and co-located epoch adapts it (`interference.adapt_online`)
            if self.reference and hasattr(self.model, "fine_tune"):
                try:
                    note = self._refine()
                except (ElasticoError, OSError, RuntimeError, ValueError) as exc:  # learning must not stop scheduling
                    note = f"predictor not refined this epoch (its weights are as before): {exc}"
                notes += [note] if note else []
        return obs.progress, families, notes

    def _refined(self, families: dict[int, Family]) -> dict[int, Family]:
        """Each family with the solo speeds its job's progress showed, over at least `MIN_PAIR_S` seconds a shape."""
        rates: dict[int, dict[str, float]] = {}
        for r in self.store.query("SELECT job_id, shape, work, seconds FROM solo_rate"):
            if r["job_id"] in families and r["seconds"] >= MIN_PAIR_S and r["work"] > 0:
                rates.setdefault(r["job_id"], {})[r["shape"]] = r["work"] / r["seconds"]
        return {j: refined(f, rates[j]) if j in rates else f for j, f in families.items()}

    def _ledger(self) -> Ledger:
        rows = self.store.query("SELECT * FROM probe_ledger WHERE gpu_type = ?", (self.gpu_type,))
        return Ledger(rows[0]["gpu_s"], rows[0]["probe_gpu_s"], rows[0]["last"]) if rows else Ledger()

    def _probe_budget(self, snapshot: Snapshot, charged: list[tuple[Colocation, float]]) -> str:
        """Count this epoch in the probe ledger (the type's GPUs up since the last; the time of each pair measured
        this epoch that the model does not know yet, `charged`, as probes), set the model's `probing` for the
        epoch; a note saying where the budget stands. In shadow mode the ledger is read, never written: the acting
        helper's probes are the ones that count."""
        ledger = self._ledger()
        if not self.shadow:
            gpus = sum(len(n.gpus) for n in snapshot.nodes if n.usable and n.gpu_type in ("", self.gpu_type))
            new = [t for o, t in charged if not self.model.knows(o)]  # type: ignore[union-attr]
            ledger = ledger.tick(snapshot.taken_at, gpus).spend(sum(new))
            self.store.execute("INSERT OR REPLACE INTO probe_ledger VALUES (?,?,?,?)",
                               (self.gpu_type, ledger.gpu_s, ledger.probe_gpu_s, ledger.last))
        self.model.probing = ledger.allows(self.probe_budget)  # type: ignore[union-attr]
        return (f"probe budget: {ledger.probe_gpu_s:.0f} GPU-s spent of {self.probe_budget * ledger.gpu_s:.0f} "
                f"({self.probe_budget:g} of the {ledger.gpu_s:.0f} GPU-s up); "
                + ("pairs never measured may be tried" if self.model.probing  # type: ignore[union-attr]
                   else "no new probe this epoch"))

    def _resolve(self, families: dict[int, Family], figures: dict[int, Family], measured: dict,
                 source: FamilySource | None, notes: list[str], now: float, noise: dict[int, float]
                 ) -> tuple[list[Colocation], list[tuple[Colocation, float]]]:
        """Judge the pairs that are ready (probe and revert), turn them into observations (also pairs whose jobs
        have left) and spend their time; (the observations, each pair measured this epoch with the seconds it
        shared a GPU since it was last judged). `figures`: the families before goodput pricing, whose shapes'
        speeds are in the units progress is counted in (the reference where no solo speed was measured); `noise`:
        each goodput job's noise scale (`job_work.noise_scales`)."""
        beside = {(r["job_id"], r["shape"], r["partner"], r["partner_shape"]): (r["work"], r["seconds"])
                  for r in self.store.query("SELECT * FROM pair_rate")}
        judged = {(r["job_id"], r["shape"], r["partner"], r["partner_shape"]): (r["work"], r["seconds"])
                  for r in self.store.query("SELECT * FROM pair_judged")}
        gone = {j for key in beside for j in (key[0], key[2])} - set(families)
        known = dict(families)  # the queue's, measured shapes included; those of departed jobs from `source`
        figures = dict(figures)
        if gone and source is not None:
            departed = with_measured(source.families(gone)[0], measured)
            known.update(departed)
            figures.update(self._refined(departed))
        solo = merge_solo({(r["job_id"], r["shape"]): (r["work"], r["seconds"])
                           for r in self.store.query("SELECT * FROM solo_rate")})
        estimates = estimated_solo(beside, solo, figures)
        window = unjudged(beside, judged)
        verdicts = self._judge(window, solo, estimates, known, notes, now, noise)
        # judged against a figure: charged, no observation (module docstring); the time so far is judged
        charged, now_judged = [], []
        for v in verdicts:
            (a, b), (sa, sb) = v.jobs, v.shapes
            if (a, sa) not in estimates and (b, sb) not in estimates:
                continue  # both measured: `pair_observations` makes it an observation
            key, back = (a, sa, b, sb), (b, sb, a, sa)
            now_judged += [(*k, *beside[k]) for k in (key, back)]
            pair = self._colocation(known, v)
            if pair is not None and key not in judged and back not in judged:  # its first judgement only
                charged.append((pair, min(window[key][1], window[back][1])))
        found, spent, pair_notes, seconds = pair_observations(beside, solo, known, self.gpu_type, window)
        notes += pair_notes
        with self.store.transaction() as conn:
            for table in ("pair_rate", "pair_judged"):
                conn.executemany(f"DELETE FROM {table} WHERE job_id=? AND shape=? AND partner=? AND partner_shape=?",
                                 spent)
            conn.executemany("INSERT OR REPLACE INTO pair_judged VALUES (?,?,?,?,?,?)", now_judged)
        return found, [*zip(found, seconds), *charged]

    def _colocation(self, known: dict[int, Family], v: Verdict) -> Colocation | None:
        """The pair of a verdict as an observation would name it (its profiles; the norms it was judged at)."""
        fams = [known.get(j) for j in v.jobs]
        shapes = [{s.name: s for s in f.shapes}.get(n) if f is not None else None for f, n in zip(fams, v.shapes)]
        if None in shapes:
            return None
        a, b = (solo_profile(s, f.kind, f.name) for s, f in zip(shapes, fams))  # type: ignore[union-attr,arg-type]
        return Colocation(self.gpu_type, a, b, v.norms[0], v.norms[1], True, SOURCE)

    def _judge(self, beside: dict, solo: dict, estimates: dict, known: dict[int, Family], notes: list[str],
               now: float, noise: dict[int, float]) -> list[Verdict]:
        """Refuse and list for undoing every ready pair that did not pay; keep the refusals in the store; the
        verdicts. A (job, shape) without a measured solo speed (`solo`) is judged against `estimates`. `noise`:
        each goodput job's noise scale, at which its floor (a speed in its units of work) is a fraction of a solo
        speed kept as a figure (`shapes.goodput.to_figure`)."""
        rates = {**estimates, **solo}
        floors: dict[tuple[int, str], float] = {}  # a family's floor is a speed; the probe's, a fraction of the solo
        for j, shape, _, _ in beside:
            fam, rate = known.get(j), rates.get((j, shape))
            if fam is not None and fam.throughput_floor > 0 and rate:
                try:
                    scale = goodput.to_figure(fam.shape(shape), noise.get(j))
                except KeyError:  # a family changed since: no scale
                    scale = 1.0
                floors[(j, shape)] = fam.throughput_floor * scale / rate
        verdicts = judge_pairings(beside, rates, floors, gain_margin(self.model), min_seconds=MIN_PAIR_S,
                                  estimated=estimates.keys())
        for v in verdicts:
            if not v.revert or None in (known.get(j) for j in v.jobs):
                notes.append(f"probe: {v.reason}")
                continue
            pair = self._colocation(known, v)
            if pair is None:
                continue  # the family changed since: the samples describe shapes it no longer has
            self.refusals.add(pair.a, pair.b, now)
            self.reverted.append(v)
        self.refusals.expire(now)
        if verdicts:
            with self.store.transaction() as conn:
                conn.execute("DELETE FROM pair_refusal")
                conn.executemany("INSERT INTO pair_refusal (body) VALUES (?)",
                                 [(json.dumps(r),) for r in self.refusals.to_list()])
        return verdicts

    def _forget(self, active: set[int]) -> None:
        """Drop what jobs that left the queue can no longer give: all of it, once no open pair needs their solo speed.

        Only from a snapshot Slurm answered for: the gateway raises `SlurmUnavailable` on an outage (22.05's
        squeue exits 0 with an `errors` list and no jobs then), so the epoch never gets here; a snapshot that
        lists no node at all is no cluster either, and forgets nothing.
        """
        with self.store.transaction() as conn:
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS active (job_id INTEGER PRIMARY KEY)")
            conn.execute("DELETE FROM active")
            conn.executemany("INSERT INTO active VALUES (?)", [(j,) for j in active])
            conn.execute("DELETE FROM progress_reading WHERE job_id NOT IN (SELECT job_id FROM active)")
            conn.execute("DELETE FROM pair_rate WHERE job_id NOT IN (SELECT job_id FROM active) "
                         "AND partner NOT IN (SELECT job_id FROM active)")  # both gone: it cannot complete
            conn.execute("DELETE FROM pair_judged WHERE NOT EXISTS (SELECT 1 FROM pair_rate p WHERE p.job_id = "
                         "pair_judged.job_id AND p.shape = pair_judged.shape AND p.partner = pair_judged.partner "
                         "AND p.partner_shape = pair_judged.partner_shape)")
            for table in ("solo_rate", "solo_counters"):
                conn.execute(f"DELETE FROM {table} WHERE job_id NOT IN (SELECT job_id FROM active) "
                             "AND job_id NOT IN (SELECT job_id FROM pair_rate) AND job_id NOT IN (SELECT partner FROM pair_rate)")

    def _record(self, snapshot: Snapshot, obs: Observation) -> None:
        """Keep this epoch's readings and samples."""
        with self.store.transaction() as conn:
            conn.executemany("INSERT OR REPLACE INTO progress_reading VALUES (?,?,?,?,?,?)",
                             [(j, r.done, r.updated, r.restarts, r.context, r.since) for j, r in obs.readings.items()])
            conn.executemany("INSERT INTO solo_rate VALUES (?,?,?,?) ON CONFLICT (job_id, shape) DO UPDATE SET "
                             "work = work + excluded.work, seconds = seconds + excluded.seconds", obs.solo)
            conn.executemany("INSERT OR REPLACE INTO solo_counters VALUES (?,?,?,?,?,?)",
                             [(j, shape, *(None if math.isnan(getattr(c, f)) else getattr(c, f) for f in COUNTER_FIELDS))
                              for j, shape, c in obs.solo_counters])
            conn.executemany("INSERT INTO pair_rate VALUES (?,?,?,?,?,?) ON CONFLICT (job_id, shape, partner, partner_shape) "
                             "DO UPDATE SET work = work + excluded.work, seconds = seconds + excluded.seconds",
                             [(*key, work, seconds) for key, work, seconds in obs.beside])

    def _refine(self) -> str | None:
        """Refine the model once `refine_batch` observations arrived since the last attempt; a note, or None."""
        from slurm_elastico.interference.online import refine  # imports torch: only with a trained model

        last = self.store.query("SELECT COALESCE(MAX(last_observation), 0) AS m FROM model_update WHERE model = ?",
                                (self.model_path,))[0]["m"]
        new = load_rows(self.store, self.gpu_type, SOURCE, after_id=last)
        if len(new) < self.refine_batch:
            return None
        earlier = [r for r in load_rows(self.store, self.gpu_type, SOURCE, last=REPLAY + len(new)) if r[0] <= last]
        first = self.store.query("SELECT error_before FROM model_update WHERE model = ? ORDER BY id LIMIT 1",
                                 (self.model_path,))
        baseline = first[0]["error_before"] if first else None
        save = (lambda: self.model.save(self.model_path)) if self.model_path else None  # type: ignore[union-attr]
        result = refine(self.model, self.reference, earlier, new, save, replay_size=REPLAY,  # type: ignore[arg-type]
                        baseline_error=baseline)
        self.store.execute(
            "INSERT INTO model_update (at, model, accepted, error_before, error_after, recent_before, recent_after,"
            " new_observations, last_observation) VALUES (?,?,?,?,?,?,?,?,?)",
            (time.time(), self.model_path, int(result.accepted), result.error_before, result.error_after,
             result.recent_before, result.recent_after, len(new), new[-1][0]))
        verdict = "kept" if result.accepted else "rolled back"
        return (f"predictor refined from {len(new)} new observation(s): {verdict} (reference error "
                f"{result.error_before:.1%} -> {result.error_after:.1%})")

