"""Strict JSON: what the commands print parses with a parser that refuses NaN and Infinity."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from slurm_elastico import jsonout


def strict(text: str):
    """`json.loads` that refuses the NaN, Infinity and -Infinity tokens Python's json writes by default."""
    def refuse(token: str):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_the_strict_parser_refuses_what_plain_json_dumps_writes():
    with pytest.raises(ValueError, match="not JSON: NaN"):
        strict(json.dumps({"x": math.nan}))


def test_non_finite_floats_become_null_and_numpy_values_plain_numbers():
    data = {
        "nan": math.nan, "inf": math.inf, "ninf": -math.inf, "ok": 1.5, "int": 3, "flag": True, "none": None,
        "np_nan": np.float64("nan"), "np_f32_inf": np.float32("inf"), "np_f32": np.float32(0.5),
        "np_int": np.int64(7), "np_bool": np.bool_(False),
        "array": np.array([[1.0, np.nan], [np.inf, 2.0]]), "ints": np.arange(3),
        "nested": [(math.nan, {"deep": [-math.inf, 4]})],
    }
    out = strict(jsonout.dumps(data, sort_keys=True))
    assert out == {
        "nan": None, "inf": None, "ninf": None, "ok": 1.5, "int": 3, "flag": True, "none": None,
        "np_nan": None, "np_f32_inf": None, "np_f32": 0.5, "np_int": 7, "np_bool": False,
        "array": [[1.0, None], [None, 2.0]], "ints": [0, 1, 2],
        "nested": [[None, {"deep": [None, 4]}]],
    }
    assert strict(jsonout.dumps({np.int64(5): "numpy key"})) == {"5": "numpy key"}


def test_a_bare_non_finite_value_and_what_default_returns_are_made_finite_too():
    assert jsonout.dumps(math.nan) == "null"
    assert strict(jsonout.dumps({"s": {1, 2}}, default=lambda o: [math.inf, *sorted(o)])) == {"s": [None, 1, 2]}


def test_allow_nan_cannot_be_turned_back_on():
    with pytest.raises(TypeError, match="allow_nan"):
        jsonout.dumps({}, allow_nan=True)


def test_a_real_command_prints_strict_json_where_a_figure_is_not_a_number():
    """One seed of `elastico sim run` has no confidence interval: each ci95 is NaN, printed as null."""
    from click.testing import CliRunner

    from slurm_elastico.cli import main

    r = CliRunner().invoke(main, ["sim", "run", "--jobs", "2", "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    out = strict(r.stdout)
    figures = out["policies"]["elastico"]
    assert figures["mean_jct_h"]["ci95"] is None and math.isfinite(figures["mean_jct_h"]["mean"])
