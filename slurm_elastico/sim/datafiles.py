"""The simulator's data files: where the bundled ones live, and how any of them (bundled or given) is read.

Every CSV the simulator reads, the ground truth's measurements and the traces
alike, goes through `read_rows`, so each is held to the same input limits
(`inputs.LIMITS["trace"]`, before and after gzip) and fails the same way: one
`ConfigError` naming the file.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from pathlib import Path

from slurm_elastico.errors import ConfigError
from slurm_elastico.inputs import LIMITS, decode, read_bytes

DATA = Path(__file__).parent / "data"
"""The bundled measurements and traces (`derive` says where each comes from)."""


def read_rows(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV (gzip-compressed when it ends in .gz) read through `inputs` (a regular file within the trace
    size limit, decompressed within it too, UTF-8); any problem raises `ConfigError` naming the file."""
    data = read_bytes(path, "trace")
    limit = LIMITS["trace"]
    if path.suffix == ".gz":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                data = f.read(limit + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise ConfigError(str(path), [f"not a gzip file ({exc}); allowed: a CSV, or one compressed by gzip "
                                          "when its name ends in .gz"]) from None
        if len(data) > limit:
            raise ConfigError(str(path), [f"decompresses to more than {limit // 2**20} MiB; allowed: a trace of at "
                                          f"most {limit // 2**20} MiB"])
    text = decode(data, str(path), "trace")
    try:
        return list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise ConfigError(str(path), [f"not a CSV file ({exc}); allowed: comma-separated text with a header "
                                      "line"]) from None
