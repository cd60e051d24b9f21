"""benchmarks/_sim_types.table: a ratio over a policy that left jobs unfinished is neither met nor missed."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks import _sim_types as st


def run(jct: float, unfinished: int = 0):
    return SimpleNamespace(jct=jct, unfinished=unfinished, counters={"refused_actions": 0}, cpu_s=1.0)


def test_targets_over_unfinished_policies_are_not_results(monkeypatch, capsys):
    monkeypatch.setattr(st.metrics, "summarize", lambda r: {"mean_jct_h": r.jct, "lower_bound_h": 0.3})
    jct = {"static": 4.0, "pollux": 1.0, "gavel": 1.9, "sia": 0.6, st.FIXED: 0.66, "elastico": 0.55, st.GOODPUT: 0.57,
           st.BLIND: 1.0}
    done = st.table({(1, n): run(v) for n, v in jct.items()}, [1])
    assert done["targets_met"] == {"elastico_over_sia": True, "blind_over_elastico": True,
                                   "sia_over_published": True, "pollux_over_published": True}
    left = st.table({(1, n): run(v, unfinished=3 if n == "sia" else 0) for n, v in jct.items()}, [1])
    assert left["targets_met"] == {"elastico_over_sia": None, "blind_over_elastico": True,
                                   "sia_over_published": None, "pollux_over_published": True}
    assert "target <= 1: not a result (jobs unfinished)" in capsys.readouterr().out
    assert left["complete"] is False and left["unfinished"]["sia"] == 3
    # elastico over sia held to the submitted batches: a figure beside the targets, with no target of its own
    assert abs(done["ratios"]["elastico_over_sia_fixed_batch"] - 0.55 / 0.66) < 1e-12
    assert "elastico_over_sia_fixed_batch" not in done["targets"]
    # elastico-goodput over sia and over elastico: figures with no target, each its own side's column
    assert abs(done["ratios"]["goodput_over_sia"] - 0.57 / 0.6) < 1e-12
    assert abs(done["ratios"]["goodput_over_elastico"] - 0.57 / 0.55) < 1e-12
    assert "goodput_over_sia" not in done["targets"] and "goodput_over_elastico" not in done["targets"]
