#!/usr/bin/env python
"""Print the predicted fraction of peak per kernel (a model, never a measurement) from the static baseline.

    PYTHONPATH=src python scripts/predicted_peak.py                 # the table of docs/predicted-peak.md
    PYTHONPATH=src python scripts/predicted_peak.py --all           # every modelled row of the baseline
    PYTHONPATH=src python scripts/predicted_peak.py --json          # wavefront.predict/1

The model is workbench/static/predict.py; docs/predicted-peak.md states it, its assumptions and its sources.
A bad argument exits 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from wavefront.workbench.document import encode
from wavefront.workbench.jobs import predict
from wavefront.workbench.jobs.request import RequestError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=predict.PredictRequest.baseline,
                        help="static baseline document (default: %(default)s)")
    parser.add_argument("--targets", default=",".join(predict.PredictRequest.targets),
                        help="comma-separated compile targets (default: %(default)s)")
    parser.add_argument("--ops", default="", help="comma-separated ops (default: every op in the baseline)")
    parser.add_argument("--all", action="store_true", help="every case, not only the documented Llama-3-8B ones")
    parser.add_argument("--json", action="store_true", help="the wavefront.predict/1 document")
    args = parser.parse_args(argv)
    request = predict.PredictRequest(baseline=args.baseline,
                                     targets=tuple(t for t in args.targets.split(",") if t),
                                     ops=tuple(o for o in args.ops.split(",") if o))
    try:
        report = predict.predict(request)
    except RequestError as exc:
        print(f"error: --{exc.argument}: {exc.message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(encode(report), indent=1))
    else:
        print(predict.markdown(report, cases=() if args.all else predict.DOC_CASES), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
