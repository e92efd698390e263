"""trainplan's planner: specs, workload, cost and memory models, simulation, search.

It never imports torch.
"""

__version__ = "0.1.0"
