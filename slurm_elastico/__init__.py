"""slurm-elastico: elastic co-location of training and offline LLM inference on Slurm."""

__version__ = "0.1.0"
