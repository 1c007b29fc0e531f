import pathlib, shutil, sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent  # console scripts of the environment running pytest

# Debian's Chromium for browser tests (never `playwright install`: it downloads, and fails offline)
CHROMIUM = next(filter(None, map(shutil.which, ('chromium', 'google-chrome'))), '/usr/bin/chromium')  # Debian; GitHub runners
CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                 '--disable-background-networking', '--disable-component-update', '--disable-sync']

# jsonschema (which nbformat imports) builds an Earley parser for IRIs at import when the optional rfc3987-syntax is
# installed: 1 to 4 s in every pytest process, for a string format nbformat never checks. Without it, no IRI checker.
sys.modules.setdefault('rfc3987_syntax', None)
