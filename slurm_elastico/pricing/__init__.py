"""Shadow pricing (ESP): prices per resource that steer each job's shape choice; pure numpy."""

from slurm_elastico.pricing.prices import NONE, PriceProblem, PriceResult, choose, costs, load, solve

__all__ = ["NONE", "PriceProblem", "PriceResult", "choose", "costs", "load", "solve"]
