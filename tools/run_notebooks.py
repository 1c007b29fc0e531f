"""Re-execute notebooks in a real Jupyter kernel and save them in place, with their outputs, cleaned of volatile metadata.

    python tools/run_notebooks.py                      # every notebook: nbs/, nbs/tutorials/ and index.ipynb
    python tools/run_notebooks.py nbs/00_core.ipynb    # some of them
    python tools/run_notebooks.py -j 2                 # two at a time

The notebooks are the documentation, and a reader (on GitHub, in nbviewer, in the rendered docs) sees only what is
stored in them, so they are stored executed. Each runs in a fresh kernel, in its own folder, as a user would run it;
the saved outputs are what that user would see (in a kernel, a fit shows the dashboard, which ends as a static summary).
A notebook that raises is not saved, and the command exits with an error naming it.
"""

import argparse, re, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def all_notebooks():
    found = (ROOT / 'nbs').rglob('*.ipynb')  # nbs/index.ipynb links to index.ipynb (for nbdev's docs): run once
    return sorted(p for p in found if '.ipynb_checkpoints' not in p.parts and not p.is_symlink()) + [
        ROOT / 'index.ipynb'
    ]


def execute(path, timeout):
    "Run every cell of `path` in a fresh kernel started in its folder; store the outputs as a reader should see them."
    import nbformat
    from nbclient import NotebookClient
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    nb = nbformat.read(path, as_version=4)
    skipped = [c for c in nb.cells if c.cell_type == 'code' and re.search(r'^#\|\s*eval:\s*false', c.source, re.M)]
    for cell in skipped:
        cell.metadata.setdefault('tags', []).append('skip-execution')  # as nbdev-test skips them
    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name='python3',
        store_widget_state=False,  # outputs are static
        resources={'metadata': {'path': str(path.parent)}},
    ).execute()
    for cell in skipped:
        cell.metadata['tags'].remove('skip-execution')
        if not cell.metadata['tags']:
            del cell.metadata['tags']
    CoalesceStreamsPreprocessor().preprocess(nb, {})  # one text output per cell, progress redraws (\r) collapsed
    nbformat.write(nb, path)


def run(path, timeout):
    "Execute `path` in a subprocess (each notebook starts clean) and clean it, if every cell ran; a report line."
    start = time.time()
    done = subprocess.run(
        [sys.executable, __file__, '--execute', str(path), '--timeout', str(timeout)], capture_output=True, text=True
    )
    if done.returncode:
        return f'FAIL {path.relative_to(ROOT)}\n{done.stderr[-3000:]}'
    subprocess.run(
        [str(Path(sys.executable).parent / 'nbdev-clean'), '--fname', str(path)],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    return f'ok   {path.relative_to(ROOT)} ({time.time() - start:.0f} s)'


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('paths', nargs='*', type=Path)
    parser.add_argument('-j', '--jobs', type=int, default=1)
    parser.add_argument('--timeout', type=int, default=900, help='seconds a cell may run')
    parser.add_argument('--execute', type=Path, help=argparse.SUPPRESS)  # the subprocess that runs one notebook
    args = parser.parse_args()
    if args.execute:
        return execute(args.execute.resolve(), args.timeout)
    paths = [p.resolve() for p in args.paths] or all_notebooks()
    with ThreadPoolExecutor(args.jobs) as pool:
        reports = list(pool.map(lambda p: run(p, args.timeout), paths))
    print('\n'.join(reports))
    if any(r.startswith('FAIL') for r in reports):
        sys.exit(1)


if __name__ == '__main__':
    main()
