"""trainplan's executor: runs a Plan on torch.distributed (`plan run`; docs/executor.md).

Importing the package imports no torch: the launcher side (preflight, topology, launch,
report) is plain Python; the ranks' side (runtime and what it uses) imports torch.
"""
