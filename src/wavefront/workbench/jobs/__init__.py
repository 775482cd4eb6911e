"""The job layer: one module per ``wavefront <verb>``, each a library call over the tool packages.

    from wavefront.workbench.jobs import inspect
    report = inspect.inspect(inspect.InspectRequest(ops=("softmax",), targets=("sm_90",)))
    report.as_dict()                                   # its JSON document, schema report.SCHEMA

A job takes a frozen request dataclass and, where it reports progress, ``on_progress(done, total, what)``
(request.ProgressFn; a job of several phases takes one per phase, request.PhaseProgress). A bad field raises
request.RequestError naming it. Every result carries ``SCHEMA`` and ``as_dict()``;
:mod:`wavefront.workbench.document` encodes what lies under the top level.

Modules: inspect (and --configs), traffic, roofline, bench, profile (bench --profile), gate, compare (and
--calibrate), bisect, report, trace (analyze, diff), plan (and --validate), counters, comm (and overlap), train.
Shared: request (torch-free), ops (fields naming registered ops, dtypes and compile targets).

Layers (import-linter, pyproject.toml): jobs > report > bench | distributed > static | trace | planner | counters
> the shared modules (stats, hardware, kpi, sqlite_schema, document). This package imports no module eagerly:
the torch-free jobs (trace, plan, counters) stay torch-free.
"""
