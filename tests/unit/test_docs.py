"""The README as the front page and the documentation site: both must hold what they promise.

The site is built with `mkdocs build --strict` into a temporary directory:
any warning (a broken link or anchor, a page missing from the nav, a
generated page that fails) fails the test. The build fetches nothing from
the network (no social or privacy plugin, no web fonts). The README is the
front page: at most 150 lines, with the two commands CI runs from it and the
packages a minimal Debian needs first.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slurm_elastico.shapes import spec as family_spec

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FAMILIES = ROOT / "docs" / "users" / "families.md"
MAX_README_LINES = 150


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; allowed: at most {MAX_README_LINES}"


def test_readme_has_the_two_commands_and_their_prerequisites():
    text = README.read_text(encoding="utf-8")
    assert re.search(r"^make demo\b", text, re.M), "README.md must show `make demo` at the start of a line"
    assert re.search(r"^make test\b", text, re.M), "README.md must show `make test` at the start of a line"
    assert text.index("make demo") < text.index("make test"), "README.md gives `make demo` before `make test`"
    # etc/dev/other-slurm --readme and .ci/run install exactly these on a minimal Debian, as the README says.
    for package in ("git", "make", "python3", "python3-venv", "ca-certificates", "procps"):
        assert re.search(rf"apt-get install[^`]*\s{re.escape(package)}(\s|$)", text), \
            f"README.md's apt-get line must name {package}"


def test_readme_has_the_headline_markers_in_order():
    text = README.read_text(encoding="utf-8")
    begin, end = text.find("<!-- results:headline -->"), text.find("<!-- /results:headline -->")
    assert 0 <= begin < end, "README.md needs <!-- results:headline --> then <!-- /results:headline -->"


def test_readme_links_point_to_files_in_the_repository():
    """The README is read on a forge, not on the site: a link must name a file that is committed, not one the
    site's build generates (the reference pages)."""
    text = README.read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert targets, "README.md links to no documentation page"
    missing = sorted({t for t in targets if t and not (ROOT / t).exists()})
    assert not missing, f"README.md links to {missing}, which are not files of the repository"


def test_family_page_names_every_key():
    text = FAMILIES.read_text(encoding="utf-8")
    keys = {*family_spec.TRAIN_KEYS, *family_spec.INFER_KEYS, *family_spec.TRAIN_MODEL_KEYS,
            *family_spec.INFER_MODEL_KEYS, *family_spec.DECLARED_KEYS}
    missing = sorted(k for k in keys if f"`{k}`" not in text)
    assert not missing, f"docs/users/families.md does not describe the family keys {missing}"


def test_family_page_examples_are_valid_families():
    blocks = re.findall(r"```yaml\n(.*?)```", FAMILIES.read_text(encoding="utf-8"), re.S)
    families = [yaml.safe_load(b) for b in blocks]
    families = [f for f in families if isinstance(f, dict) and "kind" in f]
    assert len(families) >= 3
    for i, data in enumerate(families):
        family_spec.parse_spec(data, f"docs/users/families.md, example {i + 1}")  # raises naming every problem


def test_docs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    for plugin in ("material", "mkdocs_click", "mkdocs_gen_files"):
        pytest.importorskip(plugin, reason="the docs extra is not installed (pip install -e '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    warnings = [line for line in (done.stdout + done.stderr).splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert not warnings, "mkdocs build warned:\n" + "\n".join(warnings)
    site = tmp_path / "site"
    for page in ("reference/configuration/index.html", "reference/cli/index.html",
                 "reference/job-commands/index.html", "users/families/index.html", "results/index.html"):
        assert (site / page).is_file(), f"the site lacks {page}"
    config_page = (site / "reference/configuration/index.html").read_text(encoding="utf-8")
    from slurm_elastico import config

    for key in config.valid_keys():
        assert key in config_page, f"the generated configuration page lacks {key}"
    cli_page = (site / "reference/cli/index.html").read_text(encoding="utf-8")
    assert "elastico sched" in cli_page and "--dry-run" in cli_page, "the CLI page was not generated from click"
