"""The HTML dashboard: ``build_report_data`` gathers, ``render_html`` renders, ``write_report`` does both."""

from __future__ import annotations

from pathlib import Path


def write_report(dest: str | Path, store_path: str | Path | None, documents=(), *, title: str = "wavefront dashboard",
                 devices=None) -> Path:
    """Write the self-contained dashboard to `dest`; returns the path."""
    from wavefront.workbench.report.data import build_report_data
    from wavefront.workbench.report.html import render_html

    data = build_report_data(store_path, list(documents), title=title, devices=devices)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(render_html(data), encoding="utf-8")
    return dest
