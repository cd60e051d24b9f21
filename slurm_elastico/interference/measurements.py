"""Co-location observations: one format for CSV files and the store's `colocation` table.

One row is one pair of jobs that shared one GPU of type `gpu_type`. For each job
(`a_*`, `b_*`) the row holds its solo profile (the `SoloProfile` fields) and its
observed normalized throughput `*_norm` = co-located throughput / solo
throughput (1.0 = no slowdown; slowdown S = 1 / norm). `fits` is 0 when the
pair could not run together (e.g. out of memory): then both norms are empty.
Such rows are kept because they are bad pairs for admission, but they carry no
slowdown to learn from. Any solo feature may be empty (unmeasured).

CSV columns, in order: gpu_type, fits, source, then for p in (a, b):
p_kind (train|infer), p_throughput (steps/s, > 0: optimizer steps of a
training job, forward passes (batches) of an inference job), p_batch (> 0:
samples per step of this job on this GPU: the per-GPU batch of a data-parallel
job, the sequences per forward pass of an inference job),
p_precision (fp32|fp16|bf16|fp8 or empty; fp8 = an inference job's fp8 KV cache), p_model_family, p_sm_util and
p_membw_util (NVML, 0..1), p_mem_used_mib (>= 0), p_power_w (>= 0),
p_mps_share (1..100, empty = 100), p_norm (0 < norm <= 2, empty when fits = 0).

Optional columns `a_throughput_unit` and `b_throughput_unit` say what
p_throughput counts: `steps/s` (also what an absent or empty cell means) or
`samples/s`, which is converted to steps/s by dividing by p_batch (a row
without p_batch is refused: its steps/s cannot be known). Any other unit is
refused. Files this module writes always hold steps/s and no unit columns.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from slurm_elastico.errors import ConfigError
from slurm_elastico.inputs import read_text
from slurm_elastico.interference.base import SoloProfile
from slurm_elastico.interference.errors import MeasurementError

KINDS = ("train", "infer")
PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "")
PROFILE_FIELDS = tuple(f.name for f in fields(SoloProfile))
COLUMNS = ("gpu_type", "fits", "source") + tuple(
    f"{p}_{name}" for p in ("a", "b") for name in PROFILE_FIELDS + ("norm",)
)
THROUGHPUT_UNITS = ("steps/s", "samples/s")
_FLOAT_RANGES = {  # column -> (low, high, inclusive low)
    "throughput": (0.0, math.inf, False),
    "batch": (0.0, math.inf, False),
    "sm_util": (0.0, 1.0, True),
    "membw_util": (0.0, 1.0, True),
    "mem_used_mib": (0.0, math.inf, True),
    "power_w": (0.0, math.inf, True),
    "norm": (0.0, 2.0, False),  # > 1 would be a speed-up; allow measurement noise, refuse nonsense
}


@dataclass(frozen=True, eq=False)
class Colocation:
    """One observed pair: `norm_a` is a's co-located / solo throughput when sharing a GPU with b.

    Two observations are equal when they have the same row (`to_row`), so an unmeasured (NaN) field
    equals an unmeasured one. A dataclass's own `==` would not say so on every Python: from 3.13 it
    compares field by field, and NaN != NaN, while 3.11 compared tuples, where the one NaN object
    `math.nan` equals itself.
    """

    gpu_type: str
    a: SoloProfile
    b: SoloProfile
    norm_a: float = math.nan
    norm_b: float = math.nan
    fits: bool = True
    source: str = ""

    def swapped(self) -> Colocation:
        return Colocation(self.gpu_type, self.b, self.a, self.norm_b, self.norm_a, self.fits, self.source)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Colocation):
            return NotImplemented
        return to_row(self) == to_row(other)

    def __hash__(self) -> int:
        return hash(tuple(to_row(self).values()))


def _float(text: str, column: str, where: str) -> float:
    if text is None or text.strip() == "":
        return math.nan
    try:
        value = float(text)
    except ValueError:
        raise MeasurementError(f"{where}, column {column}: {text!r} is not a number") from None
    low, high, inclusive = _FLOAT_RANGES[column.split("_", 1)[1]]
    if math.isnan(value) or value > high or value < low or (value == low and not inclusive):
        bracket = "[" if inclusive else "("
        raise MeasurementError(f"{where}, column {column}: {value:g} is outside {bracket}{low:g}, {high:g}]")
    return value


def steps_per_s(throughput: float, unit: str, batch: float, where: str) -> float:
    """`throughput` in `unit` (one of THROUGHPUT_UNITS; empty = steps/s) as steps/s; samples/s needs the batch."""
    unit = unit or "steps/s"
    if unit not in THROUGHPUT_UNITS:
        raise MeasurementError(f"{where}: {unit!r} is not a throughput unit; use one of {', '.join(THROUGHPUT_UNITS)}")
    if unit == "steps/s" or math.isnan(throughput):
        return throughput
    if math.isnan(batch):
        raise MeasurementError(f"{where}: samples/s needs the batch (samples per step) to give steps/s, "
                               "and the batch is empty; give the batch or the throughput in steps/s")
    return throughput / batch


def _profile(row: dict[str, str], p: str, where: str) -> SoloProfile:
    kind = (row.get(f"{p}_kind") or "").strip()
    if kind not in KINDS:
        raise MeasurementError(f"{where}, column {p}_kind: {kind!r} is not one of {', '.join(KINDS)}")
    precision = (row.get(f"{p}_precision") or "").strip()
    if precision not in PRECISIONS:
        raise MeasurementError(f"{where}, column {p}_precision: {precision!r} is not one of fp32, fp16, bf16, fp8 or empty")
    share_text = (row.get(f"{p}_mps_share") or "").strip()
    try:
        share = int(share_text) if share_text else 100
    except ValueError:
        raise MeasurementError(f"{where}, column {p}_mps_share: {share_text!r} is not an integer 1..100") from None
    if not 1 <= share <= 100:
        raise MeasurementError(f"{where}, column {p}_mps_share: {share} is not in 1..100")
    values = {name: _float(row.get(f"{p}_{name}", ""), f"{p}_{name}", where)
              for name in ("throughput", "batch", "sm_util", "membw_util", "mem_used_mib", "power_w")}
    values["throughput"] = steps_per_s(values["throughput"], (row.get(f"{p}_throughput_unit") or "").strip(),
                                       values["batch"], f"{where}, column {p}_throughput_unit")
    return SoloProfile(kind=kind, precision=precision, model_family=(row.get(f"{p}_model_family") or "").strip(),
                       mps_share=share, **values)


def parse_row(row: dict[str, str], where: str) -> Colocation:
    """One CSV/store row as a `Colocation`; `where` (e.g. "file.csv row 7") prefixes every error."""
    gpu = (row.get("gpu_type") or "").strip()
    if not gpu:
        raise MeasurementError(f"{where}, column gpu_type: empty (a GPU type such as a100, h100, k80 is required)")
    fits_text = str(row.get("fits", "")).strip()
    if fits_text not in ("0", "1"):
        raise MeasurementError(f"{where}, column fits: {fits_text!r} is not 0 or 1")
    fits = fits_text == "1"
    a, b = _profile(row, "a", where), _profile(row, "b", where)
    norm_a = _float(row.get("a_norm", ""), "a_norm", where)
    norm_b = _float(row.get("b_norm", ""), "b_norm", where)
    for column, value in (("a_norm", norm_a), ("b_norm", norm_b)):
        if fits and math.isnan(value):
            raise MeasurementError(f"{where}, column {column}: empty, but fits = 1 needs the observed normalized throughput")
        if not fits and not math.isnan(value):
            raise MeasurementError(f"{where}, column {column}: must be empty when fits = 0 (the pair did not run)")
    return Colocation(gpu, a, b, norm_a, norm_b, fits, (row.get("source") or "").strip())


def to_row(obs: Colocation) -> dict[str, object]:
    """The CSV/store row of an observation; NaN becomes empty (CSV) or NULL (store)."""
    row: dict[str, object] = {"gpu_type": obs.gpu_type, "fits": int(obs.fits), "source": obs.source}
    for p, profile, norm in (("a", obs.a, obs.norm_a), ("b", obs.b, obs.norm_b)):
        for name in PROFILE_FIELDS:
            value = getattr(profile, name)
            row[f"{p}_{name}"] = None if isinstance(value, float) and math.isnan(value) else value
        row[f"{p}_norm"] = None if math.isnan(norm) else norm
    return row


def read_rows(path: str | Path, columns: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    """(row number, row) of a CSV that must have `columns`; row numbers count the header as row 1, as a
    spreadsheet shows them. An unreadable file or a missing column raises `MeasurementError` naming it."""
    path = Path(path)
    text = read_measurement_text(path)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise MeasurementError(f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(columns)}")
        return list(enumerate(reader, start=2))
    except csv.Error as exc:
        raise MeasurementError(f"{path}: not a CSV file ({exc}); allowed: comma-separated text with a header") from None


def read_measurement_text(path: Path) -> str:
    """The text of a measurement file through `inputs` (a regular file within its size limit, UTF-8), or
    `MeasurementError` saying what is wrong and what is allowed."""
    try:
        return read_text(path, "measurement file")
    except ConfigError as exc:
        raise MeasurementError(f"{path}: {'; '.join(exc.problems)}") from None


def read_csv(path: str | Path) -> list[Colocation]:
    """Every observation in a measurement CSV; a missing column or bad value raises naming row and column."""
    return [parse_row(row, f"{path} row {i}") for i, row in read_rows(path, COLUMNS)]


def write_csv(path: str | Path, observations: Iterable[Colocation], append: bool = False) -> int:
    """Writes (or appends to) a measurement CSV with its header; returns the number of rows written."""
    path = Path(path)
    new = not append or not path.exists() or path.stat().st_size == 0
    count = 0
    with path.open("a" if append else "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        for obs in observations:
            writer.writerow({k: ("" if v is None else v) for k, v in to_row(obs).items()})
            count += 1
    return count


def save_to_store(store, observations: Sequence[Colocation]) -> int:
    """Appends observations to the store's `colocation` table in one transaction."""
    placeholders = ", ".join("?" for _ in COLUMNS)
    rows = [tuple(to_row(o)[c] for c in COLUMNS) for o in observations]
    store.executemany(f"INSERT INTO colocation ({', '.join(COLUMNS)}) VALUES ({placeholders})", rows)
    return len(rows)


def load_rows(store, gpu_type: str | None = None, source: str | None = None, last: int | None = None,
              after_id: int = 0) -> list[tuple[int, Colocation]]:
    """(row id, observation) in the store, oldest first: optionally of one GPU type, one source, with an id
    above `after_id`, only the `last` N."""
    sql = f"SELECT id, {', '.join(COLUMNS)} FROM colocation WHERE id > ?"
    params: list = [after_id]
    for column, value in (("gpu_type", gpu_type), ("source", source)):
        if value is not None:
            sql += f" AND {column} = ?"
            params.append(value)
    sql += " ORDER BY id DESC"
    if last is not None:
        sql += f" LIMIT {int(last)}"
    out = []
    for r in reversed(store.query(sql, params)):
        row = {c: ("" if r[c] is None else str(r[c])) for c in COLUMNS}
        out.append((int(r["id"]), parse_row(row, f"store colocation id {r['id']}")))
    return out


def load_from_store(store, gpu_type: str | None = None, source: str | None = None,
                    last: int | None = None) -> list[Colocation]:
    """Observations in the store (optionally of one GPU type, one source, only the `last` N), oldest first."""
    return [obs for _, obs in load_rows(store, gpu_type, source, last)]


def samples(observations: Iterable[Colocation]) -> tuple[list[SoloProfile], list[SoloProfile], list[float], list[int]]:
    """Both directions of every fitting pair: (self, partner, norm of self, index of the pair)."""
    selves, partners, norms, index = [], [], [], []
    for i, obs in enumerate(observations):
        if not obs.fits:
            continue
        for s, p, n in ((obs.a, obs.b, obs.norm_a), (obs.b, obs.a, obs.norm_b)):
            selves.append(s)
            partners.append(p)
            norms.append(n)
            index.append(i)
    return selves, partners, norms, index


STORE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def load(data: str) -> list[Colocation]:
    """Observations from a measurement CSV, or from a store file (by suffix: STORE_SUFFIXES)."""
    if Path(data).suffix in STORE_SUFFIXES:
        from slurm_elastico.store import Store

        with Store(data) as store:
            return load_from_store(store)
    return read_csv(data)


def save(observations: Sequence[Colocation], out: str | None, store_path: str | None) -> list[str]:
    """Append observations to a CSV, to a store file, or both; a line per destination saying what was added."""
    done = []
    if out:
        n = write_csv(out, observations, append=True)
        done.append(f"{n} row(s) appended to {out}")
    if store_path:
        from slurm_elastico.store import Store

        with Store(store_path) as store:
            n = save_to_store(store, observations)
        done.append(f"{n} row(s) added to store {store_path}")
    return done
