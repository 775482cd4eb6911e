"""The workbench: inspection, traffic, roofline, benchmarks, statistics, gates, reports, traces,
collectives, training KPIs and the cluster planner. It may import everything in wavefront; nothing
outside the workbench imports it."""
