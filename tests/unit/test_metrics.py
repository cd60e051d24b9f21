"""The helper's Prometheus metrics: counted from epochs, rendered in the text format, served over HTTP, written to a file."""

from __future__ import annotations

import os
import re
import urllib.request

import pytest

from slurm_elastico.helper.epoch import EpochResult
from slurm_elastico.helper.executor import Outcome
from slurm_elastico.helper.metrics import Metrics, observed_slowdowns, serve, write_file
from slurm_elastico.model import Action, ActionKind, Plan
from slurm_elastico.store import Store

LINE = re.compile(r'^([a-z_]+)(\{[^}]*\})? (\S+)$')


def samples(text: str) -> dict[str, float]:
    """{name{labels}: value} of every sample line; fails on any line that is not a comment or a sample."""
    out = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        m = LINE.match(line)
        assert m, f"not a sample line: {line!r}"
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def result(outcomes, outage="", prices=(0.5, 0.0, 0.25, 0.0)) -> EpochResult:
    plan = Plan(actions=tuple(o.action for o in outcomes), prices=prices)
    return EpochResult(0.0, plan, tuple(outcomes), (), (), outage, managed=(1, 2, 3), held=(3,),
                       predicted=((1, 1.25), (2, 1.0)), deferred=4)


def test_epochs_actions_prices_and_slowdowns_are_rendered():
    m = Metrics()
    share = Action(ActionKind.SET_SHARE, 1, "r", share=50)
    m.epoch(result([Outcome(share, "done"), Outcome(Action(ActionKind.SET_NODES, 1, "r", nodes=("n1",)), "failed")]),
            0.2, (3.5, 3), 1000.0)
    m.epoch(result([Outcome(share, "done")]), 7.0, (3.5, 3), 1010.0)
    m.outage(9.5, 1020.0)
    m.failed(0.01, 1030.0)
    s = samples(m.render())
    assert s['elastico_actions_total{kind="set_share",outcome="done"}'] == 2
    assert s['elastico_actions_total{kind="set_nodes",outcome="failed"}'] == 1
    assert [s[f'elastico_epochs_total{{result="{r}"}}'] for r in ("ok", "outage", "failed")] == [2, 1, 1]
    assert s["elastico_epoch_duration_seconds_count"] == 4 and s["elastico_epoch_duration_seconds_sum"] == pytest.approx(16.71)
    assert s['elastico_epoch_duration_seconds_bucket{le="0.01"}'] == 1
    assert s['elastico_epoch_duration_seconds_bucket{le="0.25"}'] == 2
    assert s['elastico_epoch_duration_seconds_bucket{le="10"}'] == 4 == s['elastico_epoch_duration_seconds_bucket{le="+Inf"}']
    assert s['elastico_price{resource="mps"}'] == 0.5 and s['elastico_price{resource="cpus"}'] == 0.25
    assert s['elastico_predicted_slowdown{job_id="1"}'] == 1.25
    assert (s["elastico_observed_slowdown_sum"], s["elastico_observed_slowdown_count"]) == (3.5, 3)
    assert (s["elastico_held_jobs"], s["elastico_managed_jobs"]) == (1, 3)
    assert s["elastico_families_deferred_jobs"] == 4  # scripts the last epoch's reading budget left for later
    assert s["elastico_last_epoch_timestamp_seconds"] == 1030


def test_observed_slowdowns_come_from_the_clusters_own_observations(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        rows = [("g", 1, "observed", 0.5, 0.8), ("g", 1, "observed", 1.0, None), ("g", 0, "observed", None, None),
                ("g", 1, "benchmark", 0.25, 0.25)]
        store.executemany("INSERT INTO colocation (gpu_type, fits, source, a_norm, b_norm) VALUES (?,?,?,?,?)", rows)
        total, count = observed_slowdowns(store, "observed")
    assert count == 3 and total == pytest.approx(2.0 + 1.25 + 1.0)


def test_the_endpoint_is_scraped_and_the_file_is_replaced(tmp_path):
    m = Metrics()
    m.outage(1.0, 5.0)
    server = serve(m, 0)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = r.read().decode()
        assert samples(body)['elastico_epochs_total{result="outage"}'] == 1
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()
    path = tmp_path / "elastico.prom"
    write_file(m, path)
    assert samples(path.read_text()) == samples(m.render()) and oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["elastico.prom"]


def test_the_text_is_prometheus_clients_own_in_a_private_registry_with_the_names_dashboards_use():
    from prometheus_client import REGISTRY
    from prometheus_client.parser import text_string_to_metric_families

    m, other = Metrics(), Metrics()
    m.epoch(result([Outcome(Action(ActionKind.SET_SHARE, 1, "r", share=50), "done")]), 0.2, (2.0, 1), 1000.0)
    kinds = {f.name: f.type for f in text_string_to_metric_families(m.render())}
    assert kinds == {"elastico_epoch_duration_seconds": "histogram", "elastico_epochs": "counter",
                     "elastico_actions": "counter", "elastico_price": "gauge", "elastico_predicted_slowdown": "gauge",
                     "elastico_observed_slowdown": "summary", "elastico_held_jobs": "gauge",
                     "elastico_managed_jobs": "gauge", "elastico_families_deferred_jobs": "gauge",
                     "elastico_last_epoch_timestamp_seconds": "gauge",
                     "elastico_predicted_gain_seconds": "gauge"}
    assert samples(other.render())['elastico_epochs_total{result="ok"}'] == 0  # each Metrics counts its own
    assert "elastico_epochs_total" not in {s.name for f in REGISTRY.collect() for s in f.samples}


def test_the_file_is_readable_by_node_exporter_under_the_helpers_private_umask(tmp_path):
    m = Metrics()
    old = os.umask(0o077)  # what the acting helper runs with
    try:
        write_file(m, tmp_path / "elastico.prom")
    finally:
        os.umask(old)
    assert oct((tmp_path / "elastico.prom").stat().st_mode & 0o777) == "0o644"
