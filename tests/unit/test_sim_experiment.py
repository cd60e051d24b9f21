"""`elastico sim compare --loads`: the loads read from the command line, and a sweep with unfinished jobs refused."""

from __future__ import annotations

import pytest

from slurm_elastico.errors import ConfigError
from slurm_elastico.sim.compare import Incomplete
from slurm_elastico.sim.experiment import MAX_LOADS, check_sweep, parse_loads


def test_loads_are_finite_numbers_above_zero_and_each_bad_one_is_named():
    assert parse_loads("0.5,1, 2") == [0.5, 1.0, 2.0]
    with pytest.raises(ConfigError) as err:
        parse_loads("1,two,nan,-1,0,inf")
    assert err.value.source == "--loads"
    assert err.value.problems == ("'two', 'nan', '-1', '0', 'inf' is not a load; allowed: comma-separated numbers > 0 "
                                  "(e.g. 0.5,1,2)",)
    assert parse_loads(",".join(["1"] * MAX_LOADS)) == [1.0] * MAX_LOADS
    with pytest.raises(ConfigError, match=f"{MAX_LOADS + 1} loads; allowed: at most {MAX_LOADS}"):
        parse_loads(",".join(["1"] * (MAX_LOADS + 1)))


class _Result:
    """A comparison as `check_sweep` reads it: (policy, seed, unfinished, jobs) of each run that left jobs."""

    def __init__(self, *incomplete: tuple[str, int, int, int]):
        self.runs = list(incomplete)

    def incomplete(self) -> list[tuple[str, int, int, int]]:
        return self.runs


def test_a_sweep_is_refused_naming_the_load_of_each_run_that_left_jobs_unfinished():
    check_sweep([1.0, 2.0], [_Result(), _Result()])  # every job finished: a result
    with pytest.raises(Incomplete) as err:
        check_sweep([1.0, 2.5], [_Result(), _Result(("static", 3, 1, 40))])
    assert err.value.runs == (("static at load 2.5", 3, 1, 40),)
    assert "policy static at load 2.5 seed 3: 1 of 40 jobs unfinished" in str(err.value)
