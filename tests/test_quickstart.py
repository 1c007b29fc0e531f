"""index.ipynb, the quick start, run headless in a real Jupyter kernel (nbclient)."""
import nbformat
from nbclient import NotebookClient

from conftest import ROOT


def test_index_notebook_runs_and_shows_bars_and_plot(tmp_path):
    nb = nbformat.read(ROOT / 'index.ipynb', as_version=4)
    NotebookClient(nb, timeout=300, kernel_name='python3', resources={'metadata': {'path': str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == 'code' for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == 'error']
    mimes = {m for o in outputs for m in o.get('data', {})}
    assert 'application/vnd.jupyter.widget-view+json' in mimes  # tqdm.notebook bars in Jupyter, not text
    assert 'image/png' in mimes                                 # recorder.plot() shown inline
    printed = ''.join(o.get('text', '') for o in outputs if o.output_type == 'stream')
    assert 'train_loss' in printed and 'accuracy' in printed    # one row per epoch
