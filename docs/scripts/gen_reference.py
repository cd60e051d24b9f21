"""Reference pages generated from the code at build time (run by mkdocs-gen-files), so they cannot go stale.

- `reference/configuration.md`: every key of `elastico.yaml`, from the same
  source as `elastico config --keys` (`slurm_elastico.config.valid_keys`), with
  each field's type, default, allowed values and help text, and the policies
  `planner.policy` may name (the planner's registry).
- `reference/job-commands.md`: `elastico-submit`'s and `elastico-run`'s own
  help texts (they are not click commands, so mkdocs-click cannot read them).

The `elastico` command's reference is `reference/cli.md`, rendered by
mkdocs-click from the click objects themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import typing

import mkdocs_gen_files

from slurm_elastico import config
from slurm_elastico.cli import run as run_cli
from slurm_elastico.cli import submit as submit_cli
from slurm_elastico.planner import policies


def section_of(key: str) -> tuple[type, str]:
    """The settings class holding a dotted key's last part, and that part (`gpu.types.TYPE.memory_mib` → the class
    of one GPU type's settings, "memory_mib")."""
    cls: type = config.Settings
    *sections, name = key.split(".")
    for section in sections:
        if section == config.TYPE_KEY:
            continue
        hint = typing.get_type_hints(cls)[section]
        cls = typing.get_args(hint)[1] if typing.get_origin(hint) is dict else hint
    return cls, name


def field_of(key: str) -> dataclasses.Field:
    """The dataclass field behind a dotted settings key (`planner.rounds`)."""
    cls, name = section_of(key)
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def type_name(key: str) -> str:
    cls, name = section_of(key)
    return typing.get_type_hints(cls)[name].__name__


def number(x: float) -> str:
    """A bound as written in the code: 16777216, not 1.67772e+07."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def allowed(f: dataclasses.Field, typ: str) -> str:
    meta = f.metadata
    if meta.get("choices"):
        return ", ".join(f"`{c}`" for c in meta["choices"])
    if f.name == "policy":
        return "a policy below"
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and hi is not None:
        return f"{number(lo)} to {number(hi)}"
    if lo is not None:
        return f"at least {number(lo)}"
    if typ == "bool":
        return "`true`, `false`"
    if typ == "str":
        return f"text, at most {config.MAX_TEXT} characters"
    return ""


def default_text(value: typing.Any) -> str:
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if value == "":
        return '`""`'
    return f"`{value}`"


def configuration_page() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated at build time from slurm_elastico/config.py by docs/scripts/gen_reference.py. -->",
        "",
        "Every key of `elastico.yaml`. Every key is optional. The file is found at `--config`, then",
        f"`${config.ENV_VAR}`, then " + ", ".join(f"`{p}`" for p in config.DEFAULT_PATHS) + ".",
        "`elastico config --keys` lists the same keys, and `elastico config` prints the settings in force.",
        "Unknown keys and bad values are refused in one message that names each problem and the valid keys.",
        "`etc/elastico.yaml` in the repository is a commented example.",
        f"In `gpu.types.{config.TYPE_KEY}.…`, `{config.TYPE_KEY}` stands for a GPU type as the nodes' gres names it",
        "(`Gres=gpu:a100:4` → `a100`): one entry per type of a mixed cluster.",
        "",
    ]
    section = None
    for key in config.valid_keys():
        head = key.split(".")[0] if "." in key else ""
        if head != section:
            section = head
            lines += ["", f"## `{head}:`" if head else "## Top level", "",
                      "| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        f = field_of(key)
        typ = type_name(key)
        help_text = f.metadata.get("help", "").replace("|", "\\|")
        lines.append(f"| `{key}` | {typ} | {default_text(f.default)} | {allowed(f, typ)} | {help_text} |")
    lines += ["", "## Policies", "", "What `planner.policy` may name (the planner's registry):", "",
              "| policy | what it does |", "|---|---|"]
    for name, policy in policies.REGISTRY.items():
        lines.append(f"| `{name}` | {policy.description} |")
    return "\n".join(lines) + "\n"


def run_help() -> str:
    """`elastico-run --help` as argparse prints it, at a fixed width."""
    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            run_cli.main(["--help"])
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return out.getvalue().rstrip()


def job_commands_page() -> str:
    return "\n".join([
        "# elastico-submit and elastico-run",
        "",
        "<!-- Generated at build time from slurm_elastico/cli/submit.py and cli/run.py"
        " by docs/scripts/gen_reference.py. -->",
        "",
        "## elastico-submit",
        "",
        "`elastico-submit --help` prints:",
        "",
        "```text",
        submit_cli.USAGE.rstrip(),
        "```",
        "",
        "Exit codes: sbatch's once sbatch ran; before that, 2 for a bad family, script or option, 3 when a",
        "Slurm command failed, 75 when Slurm is unavailable and 127 when there is no sbatch (nothing is",
        "submitted in each case). See [Submitting jobs](../users/submitting.md).",
        "",
        "## elastico-run",
        "",
        "Inside a job that elastico-submit made, elastico-run starts by itself. A hand-written batch script can",
        "call it directly:",
        "",
        "```text",
        run_help(),
        "```",
        "",
    ])


with mkdocs_gen_files.open("reference/configuration.md", "w") as fh:
    fh.write(configuration_page())
with mkdocs_gen_files.open("reference/job-commands.md", "w") as fh:
    fh.write(job_commands_page())
