"""Cost models: op times (profile or analytic device model) and collective times."""
