"""The `elastico` command: thin click commands that parse, call the library and print.

Only here are typed errors turned into messages and exit codes. Each command
group lives in its own module of this package, named in `COMMANDS` and imported
only when it runs (or help lists it): `elastico-submit` and `elastico-run`, which
live in this package too, then start without the simulator's and the
predictor's imports (scipy, torch).
"""

from __future__ import annotations

import importlib
import math
import sys

import click

from slurm_elastico import __version__
from slurm_elastico.errors import ElasticoError


COMMANDS = {
    "status": ("view", "status"),
    "config": ("view", "config_cmd"),
    "cluster": ("cluster", "cluster"),
    "iac": ("iac", "iac"),
    "demo": ("demo", "demo"),
    "sched": ("sched", "sched"),
    "report": ("report", "report"),
    "sim": ("sim", "sim"),
    "trace": ("trace", "trace"),
    "whatif": ("whatif", "whatif"),
}
"""Each `elastico` command: its module in this package and the click object there."""


class _Group(click.Group):
    """Loads each command from `COMMANDS` when asked for it; turns an `ElasticoError` into `error: ...` on stderr
    and its exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMANDS:
            module, attr = COMMANDS[name]
            command = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
            _once_each(command)
            self.add_command(command, name)
        return self.commands.get(name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ElasticoError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="elastico")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="elastico.yaml (default: $ELASTICO_CONFIG, then /etc/slurm-elastico/elastico.yaml)")
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """slurm-elastico: elastic co-location of training and LLM inference on Slurm."""
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path


class Finite(click.FloatRange):
    """`click.FloatRange` that also refuses nan and inf (a range check lets nan through: every comparison is false)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number; allowed: {self._describe_range()}", param, ctx)
        return number


def _once_each(command: click.Command) -> None:
    """Make `command` refuse an option given twice (click keeps the last silently), on it and every subcommand.

    An option that collects (`multiple`, `count`) may repeat. The check parses the arguments once more with the
    command's own parser, which only collects values: callbacks run in the real parse after it.
    """
    original = command.parse_args

    def parse_args(ctx: click.Context, args: list[str]) -> list[str]:
        _, _, order = command.make_parser(ctx).parse_args(args=list(args))
        seen: dict[str, int] = {}
        for param in order:
            if isinstance(param, click.Option) and not (param.multiple or param.count):
                seen[param.name] = seen.get(param.name, 0) + 1
        for param in command.params:
            if seen.get(param.name, 0) > 1:
                spelled = "/".join([*param.opts, *param.secondary_opts])
                raise click.UsageError(f"option {spelled} given {seen[param.name]} times; allowed: once", ctx)
        return original(ctx, args)

    command.parse_args = parse_args  # type: ignore[method-assign]
    for sub in getattr(command, "commands", {}).values():
        _once_each(sub)


def settings(ctx: click.Context):
    """The settings for this invocation, loaded once."""
    from slurm_elastico import config

    root = ctx.find_root()
    if "settings" not in root.obj:
        root.obj["settings"] = config.load(root.obj.get("config_path"))
    return root.obj["settings"]


_once_each(main)
