"""The notebooks in notebooks/ run top to bottom on their tiny settings: quickstart.ipynb
(synthetic data -> train -> score, writing a recommendations folder) and then analyst.ipynb
(reading that folder, plots and the attention heatmap)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CELL_TIMEOUT_S = 300


def execute(name: str, workdir: Path) -> nbformat.NotebookNode:
    """Run ``notebooks/<name>`` in a fresh kernel started in ``workdir``; a failing cell raises
    nbclient's CellExecutionError with the cell's traceback."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
    ).execute()
    return notebook


def images(cell: nbformat.NotebookNode) -> list[str]:
    return [
        o.data["image/png"] for o in cell.get("outputs", []) if "image/png" in o.get("data", {})
    ]


def kernel_environment(mp: pytest.MonkeyPatch, folder: Path) -> None:
    """What the kernels see: our kernelspec first on JUPYTER_PATH, outputs under ``folder``."""
    mp.setenv("JUPYTER_PATH", str(folder / "jupyter"))
    mp.setenv("RECSYS_NOTEBOOK_DIR", str(folder / "outputs"))
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.getenv("PYTHONPATH")])))
    mp.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend shows the figures
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # debugpy's frozen-modules warning


@pytest.fixture(scope="module")
def notebook_dir(tmp_path_factory):
    """Kernels run by this interpreter (a python3 kernelspec written for ``sys.executable``
    and found first on JUPYTER_PATH, so another environment's kernel is never picked), with
    outputs under a temporary folder; quickstart.ipynb has run there."""
    tmp = tmp_path_factory.mktemp("notebooks")
    write_kernel_spec(tmp / "jupyter" / "kernels" / "python3")
    with pytest.MonkeyPatch.context() as mp:
        kernel_environment(mp, tmp)
        execute("quickstart.ipynb", tmp)
        yield tmp


def test_kernel_is_this_interpreter(notebook_dir):
    spec = json.loads((notebook_dir / "jupyter/kernels/python3/kernel.json").read_text())
    assert spec["argv"][0] == sys.executable


def test_quickstart_writes_recommendations(notebook_dir):
    recs = notebook_dir / "outputs" / "recommendations"
    assert sorted(p.name for p in recs.glob("part-*.parquet")) == ["part-00000.parquet"]
    summary = json.loads((recs / "_summary.json").read_text())
    assert summary["users"] == 150
    assert summary["rows"] == 150 * 10
    assert list((notebook_dir / "outputs" / "train").glob("*/checkpoints/best.ckpt"))


def test_analyst_plots_coverage_popularity_and_attention(notebook_dir, monkeypatch):
    kernel_environment(monkeypatch, notebook_dir)
    notebook = execute("analyst.ipynb", notebook_dir)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    heatmap = [c for c in code if "heatmap" in c.metadata.get("tags", [])]
    assert len(heatmap) == 1, "analyst.ipynb tags its heatmap cell 'heatmap'"
    assert len(images(heatmap[0])) == 1
    assert sum(len(images(c)) for c in code) >= 2  # coverage / popularity and the heatmap


def test_quickstart_runs_again_in_the_same_folder(notebook_dir, monkeypatch):
    """Restart & Run All: a second run with the same OUTPUT_DIR trains into a new folder (a
    run folder that already holds a training is refused) and scores over the first output."""
    kernel_environment(monkeypatch, notebook_dir)
    execute("quickstart.ipynb", notebook_dir)
    trainings = list((notebook_dir / "outputs" / "train").glob("*/checkpoints/best.ckpt"))
    assert len(trainings) == 2


@pytest.mark.parametrize("name", ["quickstart.ipynb", "analyst.ipynb"])
def test_notebooks_are_stored_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, cell.source[:60]
            assert "\ndef " not in f"\n{cell.source}" and "\nclass " not in f"\n{cell.source}"
