import pathlib, shutil, sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent  # console scripts of the environment running pytest

# Debian's Chromium for browser tests (never `playwright install`: it downloads, and fails offline)
CHROMIUM = next(filter(None, map(shutil.which, ('chromium', 'google-chrome'))), '/usr/bin/chromium')  # Debian; GitHub runners
CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                 '--disable-background-networking', '--disable-component-update', '--disable-sync']
