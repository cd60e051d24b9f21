"""One progress line for a long wait: rewritten in place on a terminal, a line every `every_s` seconds elsewhere.

On a terminal (`isatty`) each update overwrites the line (carriage return, erase to its end), so a run of minutes
shows one line, not one per second. Where the output is a file or a CI log, a line per second would flood it: the
state is printed as a new line at most every `every_s` seconds (and always the first one). A message printed
while the line is shown must first end it (`end`), or it would be written over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

EVERY_S = 15.0
"""Seconds between two printed states where the output is not a terminal."""


class ProgressLine:
    """`update(text)` shows the current state; `end()` closes the line before anything else is printed."""

    def __init__(self, stream: TextIO, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic,
                 tty: bool | None = None):
        if not every_s > 0:
            raise ValueError(f"every_s {every_s!r}: seconds between printed states, > 0")
        self.stream, self.every_s, self.clock = stream, every_s, clock
        self.tty = stream.isatty() if tty is None else tty
        self.shown = False
        """A state is on the terminal's current line (not ended)."""
        self.last_at: float | None = None

    def update(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K")
            self.stream.flush()
            self.shown = True
            return
        now = self.clock()
        if self.last_at is None or now - self.last_at >= self.every_s:
            self.stream.write(text + "\n")
            self.stream.flush()
            self.last_at = now

    def end(self) -> None:
        """End the shown line (a terminal's): what comes next starts on a new line."""
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False
