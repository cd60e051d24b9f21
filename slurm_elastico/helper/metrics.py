"""The helper's Prometheus metrics: counted from each epoch, rendered in the text exposition format (0.0.4).

`Metrics` is fed by the helper's loop (`epoch`, `outage`, `failed`) and
rendered by `render`; `serve` answers `GET /metrics` from a daemon thread
(`elastico sched --metrics-port`), `write_file` replaces a file atomically for
node_exporter's textfile collector (`--metrics-file`). Rendering reads only
what the loop stored under a lock: the HTTP thread never touches the store or
Slurm. No client library: the format is a few lines of text.
"""

from __future__ import annotations

import math
import os
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from slurm_elastico.helper.epoch import EpochResult
from slurm_elastico.store import Store

BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Epoch duration buckets: a planning-only epoch takes milliseconds, one that reshapes waits for checkpoints."""
PRICE_RESOURCES = ("mps", "gpu_memory", "cpus", "host_memory")
"""The order of `Plan.prices`."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Metrics:
    """What the helper has done since it started, ready to render."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets = [0] * len(BUCKETS_S)
        self._duration_sum = 0.0
        self._duration_count = 0
        self._epochs: Counter[str] = Counter()
        self._actions: Counter[tuple[str, str]] = Counter()
        self._prices: tuple[float, ...] = ()
        self._predicted: dict[int, float] = {}
        self._observed = (0.0, 0)
        self._held = 0
        self._managed = 0
        self._last = 0.0

    def epoch(self, result: EpochResult, seconds: float, observed: tuple[float, int], ended_at: float) -> None:
        """Count one epoch that Slurm answered (its actions may have met an outage: `result.outage`).

        `observed` is `observed_slowdowns` of the store after the epoch."""
        with self._lock:
            self._observe_duration(seconds)
            self._epochs["outage" if result.outage else "ok"] += 1
            self._actions.update((o.action.kind.value, o.status) for o in result.outcomes)
            self._prices = tuple(result.plan.prices)
            self._predicted = dict(result.predicted)
            self._observed = observed
            self._held = len(result.held)
            self._managed = len(result.managed)
            self._last = ended_at

    def outage(self, seconds: float, ended_at: float) -> None:
        """Count an epoch that found Slurm not answering (nothing planned)."""
        with self._lock:
            self._observe_duration(seconds)
            self._epochs["outage"] += 1
            self._last = ended_at

    def failed(self, seconds: float, ended_at: float) -> None:
        """Count an epoch that failed for another reason (a locked store, a full disk)."""
        with self._lock:
            self._observe_duration(seconds)
            self._epochs["failed"] += 1
            self._last = ended_at

    def _observe_duration(self, seconds: float) -> None:
        self._duration_sum += seconds
        self._duration_count += 1
        for i, edge in enumerate(BUCKETS_S):
            if seconds <= edge:
                self._buckets[i] += 1

    def render(self) -> str:
        """Everything in Prometheus' text exposition format."""
        with self._lock:
            out: list[str] = []

            def head(name: str, kind: str, what: str) -> None:
                out.append(f"# HELP {name} {what}")
                out.append(f"# TYPE {name} {kind}")

            head("elastico_epoch_duration_seconds", "histogram", "Wall time of one helper epoch.")
            for edge, n in zip(BUCKETS_S, self._buckets):
                out.append(f'elastico_epoch_duration_seconds_bucket{{le="{_num(edge)}"}} {n}')
            out.append(f'elastico_epoch_duration_seconds_bucket{{le="+Inf"}} {self._duration_count}')
            out.append(f"elastico_epoch_duration_seconds_sum {_num(self._duration_sum)}")
            out.append(f"elastico_epoch_duration_seconds_count {self._duration_count}")
            head("elastico_epochs_total", "counter", "Epochs by result (ok, outage: Slurm did not answer, failed).")
            for result in ("ok", "outage", "failed"):
                out.append(f'elastico_epochs_total{{result="{result}"}} {self._epochs[result]}')
            head("elastico_actions_total", "counter", "Actions by kind and outcome.")
            for (kind, outcome), n in sorted(self._actions.items()):
                out.append(f'elastico_actions_total{{kind="{_label(kind)}",outcome="{_label(outcome)}"}} {n}')
            head("elastico_price", "gauge", "The last plan's shadow price per resource, in GPU equivalents.")
            for resource, price in zip(PRICE_RESOURCES, self._prices):
                out.append(f'elastico_price{{resource="{resource}"}} {_num(price)}')
            head("elastico_predicted_slowdown", "gauge", "Solo speed over planned speed of each placed job.")
            for job_id, s in sorted(self._predicted.items()):
                out.append(f'elastico_predicted_slowdown{{job_id="{job_id}"}} {_num(s)}')
            head("elastico_observed_slowdown", "summary", "Solo over co-located speed of the pairs observed.")
            out.append(f"elastico_observed_slowdown_sum {_num(self._observed[0])}")
            out.append(f"elastico_observed_slowdown_count {self._observed[1]}")
            head("elastico_held_jobs", "gauge", "Managed jobs pending and held at the last epoch's start.")
            out.append(f"elastico_held_jobs {self._held}")
            head("elastico_managed_jobs", "gauge", "Queued jobs with a family at the last epoch.")
            out.append(f"elastico_managed_jobs {self._managed}")
            head("elastico_last_epoch_timestamp_seconds", "gauge", "When the last epoch ended (Unix time).")
            out.append(f"elastico_last_epoch_timestamp_seconds {_num(self._last)}")
        return "\n".join(out) + "\n"


def observed_slowdowns(store: Store, source: str) -> tuple[float, int]:
    """(sum, count) of the slowdowns observed on the cluster: 1 / (co-located ÷ solo speed), each job of each pair."""
    row = store.query(
        "SELECT COALESCE(SUM(CASE WHEN a_norm > 0 THEN 1.0 / a_norm ELSE 0 END), 0) "
        " + COALESCE(SUM(CASE WHEN b_norm > 0 THEN 1.0 / b_norm ELSE 0 END), 0) AS s, "
        "SUM(CASE WHEN a_norm > 0 THEN 1 ELSE 0 END) + SUM(CASE WHEN b_norm > 0 THEN 1 ELSE 0 END) AS n "
        "FROM colocation WHERE fits = 1 AND source = ?", (source,))[0]
    return float(row["s"] or 0.0), int(row["n"] or 0)


def write_file(metrics: Metrics, path: str | os.PathLike[str]) -> None:
    """Replace `path` with the metrics (write, rename): the textfile collector never reads a torn file.

    The file is made readable by all (0644): node_exporter usually runs as another user."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(metrics.render(), encoding="utf-8")
        tmp.chmod(0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def serve(metrics: Metrics, port: int, address: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Answer `GET /metrics` on `address:port` from a daemon thread; `OSError` when the port cannot be bound.

    The caller calls `shutdown()` and `server_close()` on the result when the helper ends."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            body = metrics.render().encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - scrapes are not worth a log line
            return

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="elastico-metrics", daemon=True).start()
    return server
