"""Round-trip nbdev notebooks through plain text, so they can be edited with ordinary tools.

    python tools/nbpy.py to-py nbs/00_core.ipynb  > /tmp/00_core.py
    python tools/nbpy.py to-nb /tmp/00_core.py nbs/00_core.ipynb

Writing over an existing notebook keeps its cell ids for unchanged and edited cells.
In the text form a line `# %% [markdown]` starts a markdown cell and `# %%` a code cell;
markdown lines are written as they are, not commented. Outputs are dropped: run `nbdev-clean` after.
"""

import os, sys
import nbformat

MD, CODE = '# %% [markdown]', '# %%'


def to_py(nb_path):
    nb = nbformat.read(nb_path, as_version=4)
    parts = [(MD if c.cell_type == 'markdown' else CODE) + '\n' + c.source for c in nb.cells]
    return '\n\n'.join(parts) + '\n'


def to_nb(text):
    cells, kind, lines = [], None, []

    def close():
        if kind is None:
            return
        src = '\n'.join(lines).strip('\n')
        cells.append(nbformat.v4.new_markdown_cell(src) if kind == 'md' else nbformat.v4.new_code_cell(src))

    for line in text.splitlines():
        if line.strip() in (MD, CODE):
            close()
            kind, lines = ('md' if line.strip() == MD else 'code'), []
        else:
            lines.append(line)
    close()
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {'kernelspec': {'display_name': 'python3', 'language': 'python', 'name': 'python3'}}
    return nb


def keep_ids(nb, old):
    "Give cells their old ids: unchanged cells by their text, edited ones by position, so diffs and merges stay small."
    ids = {}
    for c in old.cells:
        ids.setdefault((c.cell_type, c.source), []).append(c.id)
    used = set()
    for c in nb.cells:
        same = ids.get((c.cell_type, c.source))
        if same:
            c.id = same.pop(0)
            used.add(c.id)
    for c, o in zip(nb.cells, old.cells):  # other text at the same place: an edited cell
        if c.id not in used and o.id not in used and c.cell_type == o.cell_type:
            c.id = o.id
            used.add(o.id)


if __name__ == '__main__':
    cmd, src = sys.argv[1], sys.argv[2]
    if cmd == 'to-py':
        sys.stdout.write(to_py(src))
    elif cmd == 'to-nb':
        nb, dest = to_nb(open(src).read()), sys.argv[3]
        if os.path.exists(dest):
            keep_ids(nb, nbformat.read(dest, as_version=4))
        nbformat.write(nb, dest)
    else:
        sys.exit(__doc__)
