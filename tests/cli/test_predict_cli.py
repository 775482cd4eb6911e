"""`wavefront predict`: the model's table and document through the CLI, and bad input as one line, exit 2."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from wavefront.cli import build_app

runner = CliRunner()


def test_predict_prints_the_doc_table_and_writes_the_document(tmp_path):
    out = tmp_path / "predict.json"
    result = runner.invoke(build_app(), ["predict", "--targets", "sm_90", "--ops", "softmax,attention",
                                         "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "predicted" in result.output.lower()
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wavefront.predict/1"
    ops = {row["op"] for row in doc["rows"]}
    assert ops == {"softmax", "attention"}, ops
    assert all(row["target"] == "sm_90" for row in doc["rows"])
    fractions = [row["predicted"] for row in doc["rows"] if row["predicted"] is not None]
    assert fractions and all(0.0 < f <= 1.0 for f in fractions)


def test_predict_bad_input_is_one_line_exit_2(tmp_path):
    result = runner.invoke(build_app(), ["predict", "--targets", "sm_99"])
    assert result.exit_code == 2
    assert "--targets" in result.output and "Traceback" not in result.output
    result = runner.invoke(build_app(), ["predict", "--baseline", str(tmp_path / "missing.json")])
    assert result.exit_code == 2
    assert "--baseline" in result.output and "Traceback" not in result.output
