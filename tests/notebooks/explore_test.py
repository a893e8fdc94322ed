"""Executes notebooks/explore.ipynb headless (nbclient) and checks that it is stored clean.

The notebook runs in QUICK mode (``LATTN_NOTEBOOK_QUICK=1``: shorter training and sweeps), about
two minutes on a 2-core CPU.
"""

import os
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "notebooks", "explore.ipynb")
CELL_TIMEOUT_S = 300


def _read():
    return nbformat.read(NOTEBOOK, as_version=4)


def test_notebook_is_stored_without_outputs():
    nb = _read()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"cell {i} has stored outputs; strip them"
            assert cell.execution_count is None, f"cell {i} has an execution count"


def test_the_last_cell_removes_the_temporary_run():
    # Each execution left a 2.3 MB /tmp/lattn-explore-* workdir behind.
    code = [c for c in _read().cells if c.cell_type == "code"]
    made = [c for c in code if "tempfile.mkdtemp(" in c.source]
    assert len(made) == 1 and "RUN_ROOT = tempfile.mkdtemp(" in made[0].source
    assert "shutil.rmtree(RUN_ROOT" in code[-1].source


@pytest.mark.slow  # ~100 s on 2 cores (suite time); run with -m slow after editing the notebook
@pytest.mark.entry
def test_notebook_executes(monkeypatch, tmp_path):
    # The kernel inherits this environment: QUICK mode, this interpreter first on PATH, and
    # matplotlib's headless backend.
    monkeypatch.setenv("LATTN_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    tmpdir = tmp_path / "tmp"  # the kernel's tempfile.gettempdir(): checked empty of runs
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep
                       + os.environ.get("PATH", ""))
    nb = _read()
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                 for o in c.outputs)
    assert images >= 6, f"expected the notebook's figures, got {images} images"
    left = [p.name for p in tmpdir.iterdir() if p.name.startswith("lattn-explore-")]
    assert not left, f"the notebook left its temporary run behind: {left}"
