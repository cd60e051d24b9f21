"""`elastico-submit`: the sbatch drop-in (its issue is not done yet)."""

import sys


def main() -> None:
    print("elastico-submit: not yet available in this release; use sbatch", file=sys.stderr)
    sys.exit(69)  # EX_UNAVAILABLE
