"""vTrain-style event simulation of one training iteration (Bang et al., MICRO 2024).

`build` turns a Plan into a task graph (forward/backward per micro-batch and model chunk
on every distinct stage, pipeline sends, bucketed data-parallel reductions, sharding
gathers, optimizer steps); `graph` list-schedules it over per-device streams;
`report` turns the schedule into a SimResult, a Chrome trace and a Gantt chart.
"""

from planner.simulator.report import simulate, simulate_detailed, write_gantt, write_trace

__all__ = ["simulate", "simulate_detailed", "write_gantt", "write_trace"]
