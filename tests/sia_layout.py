"""Made-up profiles in Sia's layout (no peer's data): the typed simulator's tests run on them everywhere.

Sia's measured profiles are the peers' and are never bundled; where they are absent (CI) the tests that check
their own figures are skipped, saying so, and every test of the typed machinery runs on these instead. The
numbers are invented but shaped like measurements: step times linear in the local batch with a sync time that
grows with the GPUs and the nodes, each type a fixed factor faster than `aws`, a largest local batch per type
(YOLOv3 on `rtx` stops at 8, below the others' 16), and per-epoch gradient statistics whose noise grows as
training goes on.

Import it as `tests.sia_layout` (pytest puts the repository root on sys.path).
"""

from __future__ import annotations

from pathlib import Path

TYPES = {"aws": 1.0, "rtx": 1.5, "dgx-ext": 3.0}
"""Each made-up type's speed over `aws`'s."""

APPS = {
    # app: (seconds per sample on aws, local batches, local batches on rtx, validation batches, samples per epoch)
    "cifar10": (0.0004, (32, 64, 128, 256), (32, 64, 128, 256), (128, 256, 512, 1024, 2048, 4096), 50_000),
    "yolov3": (0.02, (4, 8, 16), (4, 8), (8, 16, 32, 64), 4_000),
    "bert": (0.004, (6, 12, 24, 48), (6, 12, 24), (12, 24, 48, 96, 192, 384), 20_000),
    "deepspeech2": (0.002, (10, 20, 40), (10, 20, 40), (20, 40, 80, 160, 320, 640), 20_000),
}
PLACEMENTS = ("1", "2", "4", "8", "22", "44", "88")
EPOCHS = 10


def made_up_profiles(root: Path, types: tuple[str, ...] = tuple(TYPES)) -> Path:
    """Write the made-up profiles of `types` under `root` (created) in Sia's layout; returns `root`."""
    for app, (per_sample, local, local_rtx, batches, samples) in APPS.items():
        folder = root / app
        folder.mkdir(parents=True)
        for gpu_type in types:
            rows = []
            for placement in PLACEMENTS:
                gpus, nodes = sum(int(c) for c in placement), len(placement)
                sync = 0.0 if gpus == 1 else 0.002 * gpus + 0.01 * (nodes - 1)
                for b in (local_rtx if gpu_type == "rtx" else local):
                    rows.append(f"{placement},{b},{(0.01 + per_sample * b) / TYPES[gpu_type] + sync},{sync}")
            (folder / f"placements-{gpu_type}.csv").write_text("placement,local_bsz,step_time,sync_time\n"
                                                               + "\n".join(rows) + "\n")
        for batch in batches:
            steps = samples // batch
            (folder / f"validation-{batch}.csv").write_text("progress,iteration,metric,grad_sqr,grad_var\n" + "".join(
                f"{steps * (e + 1)}.0,{steps * (e + 1)},0.5,{1.0 / (e + 1)},{0.5 + e}\n" for e in range(EPOCHS)))
    return root


def made_up_workload(path: Path, jobs: int = 30, gap_s: float = 120.0) -> Path:
    """A workload in Sia's format (name, time, application, num_replicas, batch_size) over the made-up apps: one job
    every `gap_s` seconds, the apps and their GPU counts (1 to 8) and batches in turn; returns `path`."""
    apps = sorted(APPS)
    rows = []
    for i in range(jobs):
        app = apps[i % len(apps)]
        batches = APPS[app][3]
        rows.append(f"{app}-{i},{gap_s * i:g},{app},{(1, 2, 4, 8, 3)[i % 5]},{batches[(i // len(apps)) % len(batches)]}")
    path.write_text("name,time,application,num_replicas,batch_size\n" + "\n".join(rows) + "\n")
    return path
