"""The helper's Prometheus metrics: counted from each epoch, exposed in the text format (0.0.4) by prometheus_client.

`Metrics` is fed by the helper's loop (`epoch`, `outage`, `failed`) and
rendered by `render`; `serve` answers `GET /metrics` from a daemon thread
(`elastico sched --metrics-port`), `write_file` replaces a file atomically for
node_exporter's textfile collector (`--metrics-file`). Rendering reads only
what the loop stored under a lock: the HTTP thread never touches the store or
Slurm.

The text is prometheus_client's (`generate_latest`): its escaping and number
formatting are the library's. `Metrics` is a collector in its own
`CollectorRegistry`, never the library's global one, so nothing else in the
process (a library that registers its own metrics) leaks into the helper's
and two `Metrics` (tests) do not collide. The collector builds each family
from what the loop stored (`collect`), so the names, labels and bucket edges
(`le="10"`, not the library's `10.0`) are those administrators' dashboards
already use (docs: the helper's metrics table).
"""

from __future__ import annotations

import math
import os
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric,
                                    SummaryMetricFamily)

from slurm_elastico.helper.epoch import EpochResult
from slurm_elastico.store import Store

BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Epoch duration buckets: a planning-only epoch takes milliseconds, one that reshapes waits for checkpoints."""
PRICE_RESOURCES = ("mps", "gpu_memory", "cpus", "host_memory")
"""The order of `Plan.prices`."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""What `generate_latest` writes (newer prometheus_client releases call a later format their latest)."""


def _edge(value: float) -> str:
    """A bucket's `le` label as the helper has always written it: 10 for 10.0, 0.25 for 0.25, +Inf."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Metrics:
    """What the helper has done since it started, ready to render; a prometheus_client collector.

    `registry` is this object's own `CollectorRegistry` (it holds only this collector)."""

    def __init__(self, mode: str = "") -> None:
        """`mode` "shadow": every sample carries the label mode="shadow" (a shadow helper's series never mix with an
        acting one's on a dashboard); "" (acting): the series as they always were."""
        self.mode = mode
        self._lock = threading.Lock()
        self._buckets = [0] * len(BUCKETS_S)
        self._duration_sum = 0.0
        self._duration_count = 0
        self._epochs: Counter[str] = Counter()
        self._actions: Counter[tuple[str, str]] = Counter()
        self._prices: tuple[float, ...] = ()
        self._predicted: dict[int, float] = {}
        self._gain = 0.0
        self._observed = (0.0, 0)
        self._held = 0
        self._managed = 0
        self._deferred = 0
        self._last = 0.0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def epoch(self, result: EpochResult, seconds: float, observed: tuple[float, int], ended_at: float) -> None:
        """Count one epoch that Slurm answered (its actions may have met an outage: `result.outage`).

        `observed` is `observed_slowdowns` of the store after the epoch."""
        with self._lock:
            self._observe_duration(seconds)
            self._epochs["outage" if result.outage else "ok"] += 1
            self._actions.update((o.action.kind.value, o.status) for o in result.outcomes)
            self._prices = tuple(result.plan.prices)
            self._predicted = dict(result.predicted)
            self._gain = sum(g for _, g in result.gains if g is not None and math.isfinite(g))
            self._observed = observed
            self._held = len(result.held)
            self._managed = len(result.managed)
            self._deferred = result.deferred
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

    def collect(self) -> Iterator[Metric]:
        """Each metric family from what the loop stored (prometheus_client's collector interface)."""
        with self._lock:
            histogram = HistogramMetricFamily("elastico_epoch_duration_seconds", "Wall time of one helper epoch.")
            histogram.add_metric([], [(_edge(e), n) for e, n in zip(BUCKETS_S, self._buckets)]
                                 + [("+Inf", self._duration_count)], self._duration_sum)
            epochs = CounterMetricFamily("elastico_epochs_total",
                                         "Epochs by result (ok, outage: Slurm did not answer, failed).",
                                         labels=["result"])
            for result in ("ok", "outage", "failed"):
                epochs.add_metric([result], self._epochs[result])
            actions = CounterMetricFamily("elastico_actions_total",
                                          "Actions by kind and outcome (shadow: journaled, not issued).",
                                          labels=["kind", "outcome"])
            for (kind, outcome), n in sorted(self._actions.items()):
                actions.add_metric([kind, outcome], n)
            price = GaugeMetricFamily("elastico_price",
                                      "The last plan's shadow price per resource, in GPU equivalents.",
                                      labels=["resource"])
            for resource, value in zip(PRICE_RESOURCES, self._prices):
                price.add_metric([resource], value)
            predicted = GaugeMetricFamily("elastico_predicted_slowdown",
                                          "Solo speed over planned speed of each placed job.", labels=["job_id"])
            for job_id, s in sorted(self._predicted.items()):
                predicted.add_metric([str(job_id)], s)
            families = [
                histogram, epochs, actions, price, predicted,
                SummaryMetricFamily("elastico_observed_slowdown", "Solo over co-located speed of the pairs observed.",
                                    count_value=self._observed[1], sum_value=self._observed[0]),
                GaugeMetricFamily("elastico_predicted_gain_seconds",
                                  "JCT seconds the last epoch's plan predicts its actions gain, summed over its jobs.",
                                  value=self._gain),
                GaugeMetricFamily("elastico_held_jobs", "Managed jobs pending and held at the last epoch's start.",
                                  value=self._held),
                GaugeMetricFamily("elastico_managed_jobs", "Queued jobs with a family at the last epoch.",
                                  value=self._managed),
                GaugeMetricFamily("elastico_families_deferred_jobs",
                                  "Queued jobs whose family the last epoch had not read yet (reading budget).",
                                  value=self._deferred),
                GaugeMetricFamily("elastico_last_epoch_timestamp_seconds", "When the last epoch ended (Unix time).",
                                  value=self._last),
            ]
        if self.mode:
            for family in families:
                family.samples = [sample._replace(labels={**sample.labels, "mode": self.mode})
                                  for sample in family.samples]
        yield from families

    def render(self) -> str:
        """Everything in Prometheus' text exposition format (0.0.4)."""
        return generate_latest(self.registry).decode("utf-8")


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

    The file is made readable by all (0644) before it is renamed into place: node_exporter usually runs as another
    user. prometheus_client's `write_to_textfile` is as atomic but leaves the mode to the umask, and the acting
    helper runs with umask 077 (its state is private): node_exporter could not read the file it wrote."""
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
