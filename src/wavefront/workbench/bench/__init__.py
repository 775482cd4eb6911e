"""The benchmark harness and everything that reads its results.

timer (events, cold cache, graph replay, quantiles), runnable (the timed region), providers (wavefront
and its baselines), harness (registry x case x mode x provider), records + store (SQLite results store),
model (modeled roofline), compare (A/B of runs or git revisions), regress (the dynamic gate), bisect
(git bisect run with the gate), calibration (the statistics on synthetic samples), probe (the portable
timing end used on other revisions). The verbs' jobs over these live in the job layer
(wavefront.workbench.jobs: bench, gate, compare, bisect); nothing here imports it.
"""
