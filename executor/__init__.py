"""trainplan's executor: runs a Plan on torch.distributed (not built yet)."""
