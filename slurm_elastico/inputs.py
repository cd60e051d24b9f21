"""Reading files a user names (settings, families, job scripts, traces, measurement data) without hanging or crashing.

Every reader here raises `ConfigError` naming the file, what is wrong and what
is allowed; nothing else escapes for a bad file. The traps it closes:

- A FIFO, a device or a directory given as a file would block a plain
  `open()` forever (a FIFO waits for a writer) or read without end
  (`/dev/zero`). `read_bytes` stats the path first, refuses what is not a
  regular file, opens with O_NONBLOCK (a FIFO swapped in between the stat and
  the open cannot block) and checks the opened file again with fstat.
- Each kind of file has a size limit (`LIMITS`), named in the error, and the
  read stops one byte past it, so a huge or growing file costs no memory.
- Text must be UTF-8 (`read_text`); the error gives the first bad byte.
- YAML (`load_yaml`) is read by a `SafeLoader` that refuses duplicate keys
  (PyYAML keeps the last silently), nesting deeper than `MAX_DEPTH` (deep
  nesting ends in a RecursionError), integers beyond 64 bits (a 400-digit
  integer overflows every float conversion later), and anchors/aliases (a few
  lines of nested aliases expand to billions of nodes when walked). With
  libyaml (PyYAML's C parser) the same checks run over its parser first
  (`FastStrictLoader`); the pure-Python `StrictLoader` reads what that refuses,
  so errors read the same with or without libyaml.

`shorten` keeps error messages short when they would repeat a long list.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from typing import Any

import yaml

from slurm_elastico.errors import ConfigError

MiB = 1024 * 1024
LIMITS = {
    "settings file": 1 * MiB,
    "family file": 256 * 1024,
    "job script": 2 * MiB,
    "trace": 512 * MiB,
    "measurement file": 512 * MiB,
    "model file": 1024 * MiB,
}
"""The largest file of each kind read. A family and a job script travel inside the batch script elastico-submit
gives sbatch (base64, 4/3 the size), and Slurm's default max_script_size is 4 MB."""
MAX_DEPTH = 32
"""The deepest nesting of YAML collections accepted; no settings or family file needs more than a few levels."""
MAX_INT = 2**63 - 1
"""The largest integer (in absolute value) a YAML file may write: Slurm's own counters are 64-bit."""


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _limit(kind: str) -> int:
    try:
        return LIMITS[kind]
    except KeyError:
        raise ValueError(f"unknown kind of input {kind!r}; allowed: {', '.join(LIMITS)}") from None


def _size(n: int) -> str:
    return f"{n / MiB:g} MiB" if n >= MiB else f"{n / 1024:g} KiB"


def check_file(path: str | os.PathLike, kind: str) -> int:
    """The size of `path` when it is a regular file within `LIMITS[kind]`; `ConfigError` otherwise.

    For a file another library opens itself (a torch model): call this first, so a FIFO is refused before
    that library's blocking open.
    """
    limit = _limit(kind)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read it: {exc.strerror}"]) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(str(path), [f"is {_kind_of(st.st_mode)}; allowed: a regular file ({kind})"])
    if st.st_size > limit:
        raise ConfigError(str(path), [f"is larger than {_size(limit)}; allowed: a {kind} of at most {_size(limit)}"])
    return st.st_size


def read_bytes(path: str | os.PathLike, kind: str) -> bytes:
    """The bytes of the regular file `path`, at most `LIMITS[kind]`; anything else raises `ConfigError`."""
    limit = _limit(kind)
    where = str(path)

    def refuse(problem: str) -> ConfigError:
        return ConfigError(where, [problem])

    def not_regular(mode: int) -> ConfigError:
        return refuse(f"is {_kind_of(mode)}; allowed: a regular file ({kind})")

    check_file(path, kind)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise refuse(f"cannot read it: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between the stat and the open
            raise not_regular(st.st_mode)
        too_big = refuse(f"is larger than {_size(limit)}; allowed: a {kind} of at most {_size(limit)}")
        if st.st_size > limit:
            raise too_big
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise refuse(f"cannot read it: {exc.strerror}") from None
    if len(data) > limit:  # it grew while read
        raise too_big
    return data


def decode(data: bytes, where: str, kind: str) -> str:
    """`data` as UTF-8 text; raises `ConfigError` naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(where, [f"not UTF-8 text (byte {exc.start}, line {line}); allowed: a {kind} "
                                  "in UTF-8"]) from None


def read_text(path: str | os.PathLike, kind: str) -> str:
    """`read_bytes`, decoded as UTF-8."""
    return decode(read_bytes(path, kind), str(path), kind)


class _YamlLimitError(yaml.YAMLError):
    def __init__(self, mark: Any, problem: str):
        super().__init__(problem)
        self.mark, self.problem = mark, problem

    def __str__(self) -> str:
        at = f" (line {self.mark.line + 1}, column {self.mark.column + 1})" if self.mark is not None else ""
        return f"{self.problem}{at}"


class _StrictChecks:
    """The checks `StrictLoader` adds to YAML's composer and safe constructor, whichever parser feeds them events."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _YamlLimitError(event.start_mark, f"alias *{event.anchor} is not allowed; allowed: plain values "
                                                    "(write the value out instead of &anchor / *alias)")
        if self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise _YamlLimitError(self.peek_event().start_mark,
                                      f"nesting deeper than {MAX_DEPTH} levels; allowed: at most {MAX_DEPTH}")
            try:
                return super().compose_node(parent, index)  # type: ignore[misc]
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)  # type: ignore[misc]

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # an unhashable key: SafeLoader's own error says so
                    continue
                if first is not key_node:
                    raise _YamlLimitError(key_node.start_mark, f"duplicate key {clip(repr(key))} (first at line "
                                                               f"{first.start_mark.line + 1}); allowed: each key once")
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]

    def construct_yaml_int(self, node: Any) -> int:
        value = super().construct_yaml_int(node)  # type: ignore[misc]
        if abs(value) > MAX_INT:
            raise _YamlLimitError(node.start_mark, f"integer {clip(node.value)} is too large; allowed: at most "
                                                   f"{MAX_INT} in absolute value")
        return value


class StrictLoader(_StrictChecks, yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses duplicate keys, deep nesting, huge integers and aliases (see the module).

    Pure Python: the reference. `load_yaml` reads with `FastStrictLoader` when PyYAML has libyaml, and with this
    loader whenever that one refuses a text (so an error is always this loader's)."""


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)


def _fast_loader() -> type | None:
    """`StrictLoader`'s checks over libyaml's parser (`yaml.cyaml.CParser`), composed and constructed by the same
    Python code as `StrictLoader`'s; None when the installed PyYAML was built without libyaml."""
    if not getattr(yaml, "__with_libyaml__", False):
        return None
    from yaml.composer import Composer
    from yaml.constructor import SafeConstructor
    from yaml.cyaml import CParser
    from yaml.resolver import Resolver

    class FastStrictLoader(_StrictChecks, Composer, CParser, SafeConstructor, Resolver):
        def __init__(self, stream: Any):
            CParser.__init__(self, stream)
            Composer.__init__(self)  # Composer precedes CParser in the bases: the Python composer, with our checks
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    FastStrictLoader.add_constructor("tag:yaml.org,2002:int", FastStrictLoader.construct_yaml_int)
    return FastStrictLoader


FastStrictLoader = _fast_loader()
"""What `load_yaml` tries first on a text without `NOT_PLAIN`: several times faster than `StrictLoader` on a family
(libyaml scans and parses; composing and constructing stay in Python)."""
NOT_PLAIN = re.compile(r"[^\n\r\x20-\x7e]|[?!|>%@`]")
"""What sends a text to `StrictLoader` alone: anything but ASCII text, and these characters. Around them the two
parsers part (seen by fuzzing): the pure scanner refuses a tab between tokens and `?` inside a flow scalar that
libyaml reads; a bare `!` tag is None to one and "" to the other; `|#` or `>#` opens a block scalar only for
libyaml; a byte-order mark inside the text is read two ways. `%`, `@` and `` ` `` (directives, reserved) go the
same way. A text with none of them reads the same by both (tests/unit/test_inputs.py compares them on mutated
family texts)."""


def clip(text: str, limit: int = 40) -> str:
    """`text`, cut to `limit` characters with its length said, for an error message that quotes a value."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def load_yaml(text: str, where: str) -> Any:
    """Parsed YAML by `StrictLoader`; any problem raises `ConfigError` naming `where`.

    A text without `NOT_PLAIN` is read by `FastStrictLoader` first where there is one; whatever that refuses (or
    fails on) is read again by `StrictLoader`, whose value or error is then the answer (libyaml words its errors
    otherwise, and a text only libyaml refuses is still read)."""
    if FastStrictLoader is not None and not NOT_PLAIN.search(text):
        read, value = _read_fast(text)
        if read:
            return value
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(where, [f"not valid YAML: {clip(str(exc), 2000)}"]) from None
    except RecursionError:  # nesting inside one scalar-free flow the composer does not see; a backstop
        raise ConfigError(where, [f"not valid YAML: nested too deep; allowed: at most {MAX_DEPTH} levels"]) from None


def _read_fast(text: str) -> tuple[bool, Any]:
    """(True, the value) when `FastStrictLoader` reads `text`; (False, None) when it refuses it with what a parser or
    a constructor raises on a bad text, for `StrictLoader` to decide and word. Anything else is a defect and rises."""
    try:
        return True, yaml.load(text, Loader=FastStrictLoader)  # noqa: S506 - a SafeConstructor
    except (yaml.YAMLError, RecursionError, ValueError, TypeError):
        return False, None


def read_yaml(path: str | os.PathLike, kind: str) -> Any:
    """`read_text` then `load_yaml`: a user's YAML file of this kind, checked."""
    return load_yaml(read_text(path, kind), str(path))


def shorten(items: Iterable[Any], limit: int = 10) -> str:
    """`items` comma-separated, at most `limit` of them: "1, 2, 3, ... and 99997 more"."""
    shown, more = [], 0
    for i, item in enumerate(items):
        if i < limit:
            shown.append(str(item))
        else:
            more += 1
    return ", ".join(shown) + (f", ... and {more} more" if more else "")

