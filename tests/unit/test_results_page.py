"""The results page (benchmarks/results_page.py): rendered from captured JSON only, the committed page matches its
JSON, NaN shows as "n/a", failures and missing benchmarks are shown, and capture keeps a benchmark's failure.

No benchmark runs here: the capture tests run tiny stand-in scripts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import results_capture as capture
from benchmarks import results_page as page
from benchmarks import results_sections as sections

ROOT = Path(__file__).resolve().parents[2]

PROV = {"commit": "0123456789ab-dirty", "date": "2030-01-02 03:04 UTC", "mode": "quick",
        "machine": {"cpu": "Test CPU 9000", "cpus": 2, "memory_gib": 8.0, "os": "Debian GNU/Linux 13 (trixie)",
                    "python": "3.13.1", "torch": "2.13.0+cpu", "load_avg_1m": 3.5}}


def policy(mean: float, over: float | None, unfinished: int = 0, refused: int = 0) -> dict:
    p = {"mean_jct_h": mean, "ci95": 0.05, "lower_bound_h": 0.5, "ratio_to_lb": mean / 0.5, "unfinished": unfinished,
         "refused_actions": refused, "skipped_actions": 0, "result": unfinished == 0}
    if over is not None:
        p.update(over_elastico=over, paired_ratio=over, paired_ci95=0.1)
    return p


def sim_record(elastico: float = 0.8, static: float = 1.2, pollux: float = 1.0, unfinished: int = 0) -> dict:
    pols = {"elastico": policy(elastico, None, unfinished, refused=3), "static": policy(static, static / elastico),
            "pollux": policy(pollux, pollux / elastico)}
    figures = {"quick": True, "comparison": [{"label": "8 GPUs, 40 jobs, load 2 (45 runs, 10 s CPU)",
                                              "static_util_arrivals": 0.8, "policies": pols,
                                              "unfinished_jobs": unfinished, "unfinished_rows": int(unfinished > 0)}],
               "alibaba": None, "alibaba_not_run": "no trace given", "unfinished_jobs": unfinished,
               "complete": unfinished == 0, "wall_s": 30.0, "workers": 2}
    return {"benchmark": "sim", "command": ".venv/bin/python benchmarks/sim.py --quick", "wall_s": 31.0,
            "provenance": PROV, "figures": figures}


def checkpoint_record() -> dict:
    rows = [{"mib": 16, "save_s": 0.16, "load_s": 0.06, "save_mib_s": 100.0, "load_mib_s": 266.7}]
    return {"benchmark": "checkpoint", "command": ".venv/bin/python benchmarks/checkpoint.py --quick",
            "wall_s": 5.0, "provenance": PROV, "figures": {"rows": rows, "tiny_example_save_s": 0.0321}}


def test_render_shows_each_figure_with_its_provenance_and_how_to_reproduce():
    results = {"sim": sim_record(), "checkpoint": checkpoint_record(),
               "reshape": {"benchmark": "reshape", "command": ".venv/bin/python benchmarks/reshape.py --quick",
                           "wall_s": 2.0, "provenance": PROV, "error": "exit status 1; no slurmd here"}}
    text = page.render(results)
    # figures, from the records only
    assert "| elastico | 0.800 ± 0.050 | 1 (reference) |" in text
    assert "1.50 (paired 1.50 ± 0.10)" in text  # static's mean JCT over elastico's
    assert "| 16 | 160.0 | 60.0 | 100 | 267 |" in text
    assert "32.1 ms" in text
    # provenance and reproduction, per benchmark
    assert "`0123456789ab-dirty`" in text and "2030-01-02 03:04 UTC" in text and "quick mode" in text
    assert "Test CPU 9000 (2 CPUs), 8 GiB memory, Debian GNU/Linux 13 (trixie)" in text
    assert "torch 2.13.0+cpu" in text.split("## Checkpoint")[1]
    assert "torch" not in text.split("## Simulation")[1].split("## ")[0]  # sim does not use torch
    assert "`.venv/bin/python benchmarks/sim.py --quick`" in text
    # dropped work beside the mean, failures and missing benchmarks shown, not left out
    assert "| 0 | 3 | yes |" in text  # elastico: unfinished 0, refused actions 3
    assert "no slurmd here" in text and "**Not measured on this machine**" in text
    assert "docs/results/planner.json is missing" in text
    assert "not run (no trace given)" in text
    assert "![Simulation: mean JCT against plain Slurm and the baselines](results/sim.png)" in text


def test_goodput_mode_rows_show_paired_ratios_targets_and_unfinished_jobs():
    rec = sim_record()
    mixed = rec["figures"]["comparison"][0]
    mixed["policies"]["elastico-goodput"] = policy(0.5, 0.5 / 0.8)
    mixed["goodput"] = {"static_over": 2.4, "ci95": 0.2, "seeds": 5, "target": ">= 2.5", "met": False, "unfinished": 0}
    cols = ("elastico", "elastico-goodput", "pollux@peer")
    rec["figures"]["pollux"] = {
        "workloads": [{"workload": 1, "mean_jct_s": dict(zip(cols, (2000.0, 1800.0, 2100.0))),
                       "lower_bound_s": dict.fromkeys(cols, 1300.0), "unfinished": {"elastico-goodput": 1},
                       "peer_mean_jct_s": {"pollux": 2089, "tiresias": 2474, "optimus": 4087}}],
        "mean_jct_s": dict(zip(cols, (2000.0, 1800.0, 2100.0))), "ci95_s": dict(zip(cols, (10.0, 12.0, None))),
        "lower_bound_s": dict.fromkeys(cols, 1300.0), "seeds": 2, "unfinished": dict(zip(cols, (0, 1, 0))),
        "refused_actions": dict.fromkeys(cols, 0),
        "goodput": {"elastico": {"ratio": 0.9, "ci95": 0.01, "unfinished": 1},
                    "pollux@peer": {"ratio": 0.857, "ci95": 0.02, "unfinished": 1, "target": "<= 0.85", "met": False}}}
    text = page.render({"sim": rec})
    assert "| elastico-goodput | 0.500 ± 0.050 | 0.62 (paired 0.62 ± 0.10) |" in text
    assert ("static's mean JCT over elastico-goodput's, paired by seed, 2.40 ± 0.20 (5 seeds; target >= 2.5: "
            "**not met**; unfinished jobs 0)") in text
    assert "| 1 | 2000 | 1800* | 2100 |" in text
    assert "| mean | 2000 ± 10 | 1800 ± 12 | 2100 ± n/a |" in text
    assert "| elastico-goodput ÷ pollux@peer | 0.857 ± 0.020 | <= 0.85 | no | 1 |" in text
    assert "| elastico-goodput ÷ elastico | 0.900 ± 0.010 | – | – | 1 |" in text
    # a capture without goodput mode shows no such rows, and its mean row no interval
    del rec["figures"]["pollux"]["goodput"], rec["figures"]["pollux"]["ci95_s"], mixed["goodput"]
    old = page.render({"sim": rec})
    assert "Goodput mode" not in old and "| mean | 2000 | 1800 | 2100 |" in old


def test_the_headline_names_both_gains_and_the_commit():
    sentence = page.headline(sim_record(elastico=0.8, static=1.2, pollux=0.76))
    assert "33% lower than plain Slurm's" in sentence  # 1 - 0.8 / 1.2
    assert "5% higher than the Pollux baseline's" in sentence  # 1 - 0.8 / 0.76 = -5 %
    assert "`0123456789ab-dirty`" in sentence and "quick mode" in sentence
    assert "(docs/results.md)" in sentence and "NOT A RESULT" not in sentence
    assert "NOT A RESULT: 2 job(s) unfinished" in page.headline(sim_record(unfinished=2))
    failed = {"benchmark": "sim", "provenance": PROV, "error": "exit status 1"}
    assert "no measured headline" in page.headline(failed) and "no measured headline" in page.headline(None)


def test_a_row_with_unfinished_jobs_is_marked_not_a_result():
    text = page.render({"sim": sim_record(unfinished=4)})
    assert "**NOT A RESULT** (4 unfinished)" in text and "**NOT COMPLETE: not a result**" in text


def test_nan_figures_show_as_n_a_never_as_numbers():
    rec = sim_record()
    rec["figures"]["comparison"][0]["policies"]["static"].update(mean_jct_h=math.nan, over_elastico=math.nan,
                                                                  paired_ratio=math.nan)
    rec["figures"]["comparison"][0]["policies"]["pollux"]["ratio_to_lb"] = None  # NaN as stored: JSON null
    text = page.render({"sim": rec})
    assert "| static | n/a ± 0.050 | n/a (paired n/a ± 0.10) |" in text
    assert "n/a than plain Slurm's" in page.headline(rec)
    assert "nan" not in text.lower().replace("n/a", "")
    # what capture stores: strict JSON, NaN and infinities as null
    stored = capture.finite({"a": [1.0, math.nan], "b": {"c": math.inf}, "d": "x"})
    assert stored == {"a": [1.0, None], "b": {"c": None}, "d": "x"}
    json.dumps(stored, allow_nan=False)


def test_the_committed_page_is_the_rendering_of_the_committed_json():
    """A figure edited by hand in docs/results.md (or JSON not committed) fails here: `make results` rewrites both."""
    missing = [n for n in capture.BENCHMARKS if not (page.RESULTS / f"{n}.json").exists()]
    assert not missing, f"docs/results/{{{','.join(missing)}}}.json not committed: run `make results` and commit"
    results = page.load()
    assert page.PAGE.read_text() == page.render(results), (
        "docs/results.md differs from what its JSON renders: run `.venv/bin/python benchmarks/results_page.py` "
        "(or `make results`) instead of editing it")
    for name in sections.PLOTS:
        if "figures" in results[name]:
            assert (page.RESULTS / f"{name}.png").exists(), f"docs/results/{name}.png is missing"


def test_the_readme_headline_is_the_rendering_of_the_committed_json():
    readme = page.README.read_text()
    assert page.readme_block(readme, page.headline(page.load().get("sim"))) == readme, (
        "README.md's headline block differs from what docs/results/sim.json renders: run "
        "`.venv/bin/python benchmarks/results_page.py` instead of editing it")


def test_the_readme_headline_block_is_replaced_and_its_absence_named():
    readme = f"# x\n\nintro\n{page.BEGIN}\nold words\n{page.END}\n\nrest\n"
    assert page.readme_block(readme, "New.") == f"# x\n\nintro\n{page.BEGIN}\nNew.\n{page.END}\n\nrest\n"
    with pytest.raises(page.PageError, match="results:headline"):
        page.readme_block("# x\nno markers\n", "New.")
    with pytest.raises(page.PageError, match="in that order"):
        page.readme_block(f"{page.END}\n{page.BEGIN}\n", "New.")


def test_every_benchmark_is_on_the_page():
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith(("results_", "_"))}
    assert scripts == set(capture.BENCHMARKS) == set(sections.ABOUT) == set(sections.BODIES)
    from benchmarks import results_plots

    assert set(sections.PLOTS) == set(results_plots.DRAW)


def test_capture_keeps_a_failure_and_a_last_line_that_is_not_json(tmp_path: Path):
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "good.py").write_text("print('a table')\nprint('{\"x\": NaN, \"y\": 2}')\n")
    (bench / "crash.py").write_text("import sys\nprint('{}')\nsys.exit(f'something broke in {__file__}')\n")
    (bench / "prose.py").write_text("print('{\"x\": 1}')\nprint('done')\n")
    good = capture.run_one("good", False, PROV, root=tmp_path)
    assert good["figures"] == {"x": None, "y": 2} and "error" not in good
    assert good["command"] == ".venv/bin/python benchmarks/good.py --quick"
    crash = capture.run_one("crash", True, PROV, root=tmp_path)
    assert crash["error"].startswith("exit status 1") and "something broke" in crash["error"]
    assert str(tmp_path) not in crash["error"]  # a traceback names files as in a reader's checkout
    assert "figures" not in crash and crash["command"] == ".venv/bin/python benchmarks/crash.py"
    prose = capture.run_one("prose", False, PROV, root=tmp_path)
    assert "last line is not JSON" in prose["error"] and "'done'" in prose["error"]


def test_plots_draw_from_the_committed_json(tmp_path: Path):
    pytest.importorskip("matplotlib", reason="matplotlib is the `plot` extra")
    from benchmarks import results_plots

    results = page.load()
    for name in sections.PLOTS:
        if "figures" in results.get(name, {}):
            results_plots.draw(name, results[name]["figures"], tmp_path / f"{name}.png")
            assert (tmp_path / f"{name}.png").stat().st_size > 1000


def test_check_names_a_figure_edited_by_hand(tmp_path: Path, monkeypatch, capsys):
    edited = tmp_path / "results.md"
    text = page.PAGE.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| elastico |"))
    cells = row.split("|")
    cells[2] = " 0.001 ± 0.001 "  # elastico's mean JCT, typed in
    edited.write_text(text.replace(row, "|".join(cells), 1))
    monkeypatch.setattr(page, "PAGE", edited)
    assert page.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/results.md differs from its rendering" in err and "0.001 ± 0.001" in err
    edited.write_text(text)
    assert page.main(["--check"]) == 0
