"""index.ipynb, the quick start, run headless in a real Jupyter kernel (nbclient)."""

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT, kernel_manager

pytestmark = pytest.mark.kernel


def test_index_notebook_runs_and_shows_the_dashboard_summary_and_plot(tmp_path):
    nb = nbformat.read(ROOT / 'index.ipynb', as_version=4)
    NotebookClient(nb, timeout=300, km=kernel_manager(), resources={'metadata': {'path': str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == 'code' for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == 'error']
    mimes = {m for o in outputs for m in o.get('data', {})}
    assert 'image/png' in mimes  # recorder.plot() shown inline
    summary = [o for o in outputs if 'Fit finished at step 230 of 230' in o.get('data', {}).get('text/html', '')]
    assert len(summary) == 1  # the dashboard, replaced by its static summary when the fit ended
    html = summary[0].data['text/html']
    assert html.count('<tr') == 1 + 10 and 'accuracy' in html and 'data:image/png;base64,' in html  # a row per epoch
