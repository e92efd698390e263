"""The four artifacts' types: ModelSpec, ClusterSpec, Plan (Profile lives in profiler)."""
