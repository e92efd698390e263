"""trainplan's profiler: device catalog, analytic device model, measured profiles.

Imports nothing of the other trainplan packages.
"""
