"""`elastico-run`: the in-job wrapper (its issue is not done yet)."""

import sys


def main() -> None:
    print("elastico-run: not yet available in this release", file=sys.stderr)
    sys.exit(69)  # EX_UNAVAILABLE
