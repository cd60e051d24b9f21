"""slurm_elastico.inputs: user-given files are refused, not hung on or crashed on, with a message naming what is wrong."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from slurm_elastico import inputs
from slurm_elastico.errors import ConfigError


def _problem(exc: pytest.ExceptionInfo) -> str:
    assert isinstance(exc.value, ConfigError)
    assert len(exc.value.problems) == 1
    return exc.value.problems[0]


def test_a_regular_file_is_read(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text("kind: train\nsteps: 5\n")
    assert inputs.read_yaml(f, "family file") == {"kind": "train", "steps": 5}


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = []
    reader = threading.Thread(target=lambda: done.append(pytest.raises(ConfigError, inputs.read_text, fifo,
                                                                       "settings file")), daemon=True)
    reader.start()
    reader.join(5)
    assert done, "reading a FIFO blocked"
    assert "FIFO" in _problem(done[0]) and "allowed: a regular file" in _problem(done[0])


@pytest.mark.parametrize("path, what", [("/dev/zero", "character device"), ("/", "directory")])
def test_devices_and_directories_are_refused(path, what):
    with pytest.raises(ConfigError) as exc:
        inputs.read_bytes(path, "trace")
    assert what in _problem(exc) and exc.value.source == path


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(ConfigError) as exc:
            inputs.read_bytes(path, "job script")
    assert "socket" in _problem(exc)


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(ConfigError) as exc:
        inputs.read_bytes(tmp_path / "nope", "family file")
    assert "cannot read it: No such file" in _problem(exc)


def test_size_limit_per_kind_is_named(tmp_path):
    f = tmp_path / "big.yaml"
    limit = inputs.LIMITS["family file"]
    f.write_bytes(b"#" * limit)
    assert len(inputs.read_bytes(f, "family file")) == limit  # exactly the limit is fine
    f.write_bytes(b"#" * (limit + 1))
    with pytest.raises(ConfigError) as exc:
        inputs.read_bytes(f, "family file")
    assert "larger than 256 KiB; allowed: a family file of at most 256 KiB" in _problem(exc)


def test_unknown_kind_is_a_programming_error(tmp_path):
    with pytest.raises(ValueError, match="allowed: settings file"):
        inputs.read_bytes(tmp_path, "novel")


def test_not_utf8_names_the_byte_and_line(tmp_path):
    f = tmp_path / "bin"
    f.write_bytes(b"a: 1\nb: \xff\xfe\n")
    with pytest.raises(ConfigError) as exc:
        inputs.read_text(f, "settings file")
    assert "not UTF-8 text (byte 8, line 2); allowed: a settings file in UTF-8" == _problem(exc)


@pytest.mark.parametrize("text, expected", [
    ("a: 1\nb: 2\na: 3\n", "duplicate key 'a' (first at line 1); allowed: each key once (line 3"),
    ("x:\n  y: 1\n  y: 1\n", "duplicate key 'y'"),
    ("a: " + "[" * 40 + "]" * 40, f"nesting deeper than {inputs.MAX_DEPTH} levels"),
    ("a: " + "[" * 100000 + "]" * 100000, f"nesting deeper than {inputs.MAX_DEPTH} levels"),
    ("n: " + "9" * 400, "integer 9999999999999999999999999999999999999999... (400 characters) is too large"),
    ("n: -9223372036854775809", "is too large; allowed: at most 9223372036854775807"),
    ("a: &x [1, 2]\nb: *x\n", "alias *x is not allowed"),
    ("a: [1, 2\n", "not valid YAML"),
])
def test_strict_yaml_refuses(text, expected):
    with pytest.raises(ConfigError) as exc:
        inputs.load_yaml(text, "f.yaml")
    assert exc.value.source == "f.yaml"
    assert expected in _problem(exc)


def test_strict_yaml_keeps_what_is_fine():
    text = "a: " + "[" * (inputs.MAX_DEPTH - 1) + "]" * (inputs.MAX_DEPTH - 1) + "\nn: 9223372036854775807\nm: {x: 1, y: 2}\n"
    data = inputs.load_yaml(text, "f.yaml")
    assert data["n"] == 2**63 - 1 and data["m"] == {"x": 1, "y": 2}
    depth, node = 0, data["a"]
    while isinstance(node, list):
        depth, node = depth + 1, node[0] if node else None
    assert depth == inputs.MAX_DEPTH - 1  # the top mapping is one of the levels


def test_shorten():
    assert inputs.shorten(range(3)) == "0, 1, 2"
    assert inputs.shorten(range(100000), limit=3) == "0, 1, 2, ... and 99997 more"
    assert inputs.shorten([]) == ""


def test_clip():
    assert inputs.clip("short") == "short"
    assert inputs.clip("x" * 100, limit=5) == "xxxxx... (100 characters)"


def _answer(text: str) -> tuple[str, object]:
    """What `load_yaml` answers: ("ok", its value and that value's repr, types included) or ("error", the problem)."""
    try:
        data = inputs.load_yaml(text, "f.yaml")
    except ConfigError as exc:
        return "error", exc.problems
    return "ok", (data, repr(data))


def _both(text: str, monkeypatch) -> tuple[tuple, tuple]:
    """`load_yaml`'s answer with libyaml first, and with the pure-Python loader alone (no libyaml installed)."""
    fast = _answer(text)
    with monkeypatch.context() as m:
        m.setattr(inputs, "FastStrictLoader", None)
        pure = _answer(text)
    return fast, pure


needs_libyaml = pytest.mark.skipif(inputs.FastStrictLoader is None, reason="PyYAML without libyaml")


@needs_libyaml
def test_family_texts_read_the_same_with_and_without_libyaml(monkeypatch):
    """Mutated family texts (inserted, deleted and replaced YAML characters): the same value, or the same error,
    whichever loader reads them first."""
    import random
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    texts = [p.read_text(encoding="utf-8") for p in (*sorted((root / "wrappers" / "examples").glob("*.family.yaml")),
                                                       *sorted((root / "etc" / "examples" / "families").glob("*.yaml")))]
    assert texts
    chars = " \n\r:-[]{},#&*'\"\\x01.eE+_~nyYtTofF" + "\t?!|>%@`\ufeff\u00e9\u2028"
    rng = random.Random(30)
    fast_read = 0
    for _ in range(600):
        text = list(rng.choice(texts))
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(text))
            what = rng.random()
            if what < 0.4:
                text.insert(i, rng.choice(chars))
            elif what < 0.7:
                del text[i]
            else:
                text[i] = rng.choice(chars)
        text = "".join(text)
        fast, pure = _both(text, monkeypatch)
        assert fast == pure, text
        fast_read += not inputs.NOT_PLAIN.search(text)
    assert fast_read > 200  # most were read by libyaml first


@needs_libyaml
@pytest.mark.parametrize("text", [
    "name: t\tiny\n",  # a tab between tokens: libyaml reads it, the pure scanner refuses it
    "max_num_seqs: [6?4, 256]\n",  # `?` inside a flow scalar: the same
    "cpus: !\n",  # a bare tag: "" to libyaml, None to the pure constructor
    "model: |# hints\n  x\n",  # a block scalar header before a comment: only libyaml opens one
    "model:\n  a: 1\n\ufeff b: 2\n",  # a byte-order mark inside the text
])
def test_texts_the_parsers_read_differently_get_the_pure_loaders_answer(text, monkeypatch):
    import yaml

    try:
        libyaml = ("ok", yaml.load(text, Loader=inputs.FastStrictLoader))  # noqa: S506 - a SafeConstructor
    except yaml.YAMLError:
        libyaml = ("error", None)
    try:
        reference = ("ok", yaml.load(text, Loader=inputs.StrictLoader))  # noqa: S506 - a SafeConstructor
    except yaml.YAMLError:
        reference = ("error", None)
    assert libyaml != reference  # they do part here
    fast, pure = _both(text, monkeypatch)
    assert fast == pure and fast[0] == reference[0]


@needs_libyaml
@pytest.mark.parametrize("text", ["a: 1\nb: 2\na: 3\n", "a: &x [1, 2]\nb: *x\n", "n: " + "9" * 400,
                                  "a: " + "[" * 40 + "]" * 40, "a: [1, 2\n", "kind: train\nsteps: 5\n"])
def test_libyaml_first_gives_the_pure_loaders_value_or_error(text, monkeypatch):
    fast, pure = _both(text, monkeypatch)
    assert fast == pure
