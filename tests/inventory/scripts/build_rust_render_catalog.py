"""Build the bundled catalog of vLLM's Rust render server from a live run (project venv).

    .venv/bin/python tests/inventory/scripts/build_rust_render_catalog.py \\
        --python ~/.cache/vllm-perimeter/venvs/vllm-0.33.0/bin/python \\
        -o policies/catalog/vllm-0.33.0-rust-render.json

Builds a tiny model directory with that vLLM's Python, starts its ``vllm-rs render`` on
loopback (engine-free, offline), runs ``inventory live`` against it with the binary's own
route list and every extracted bundled catalog as candidates, and writes the inventory with
a stable source target (the URL's random port would change the bytes every run).
See ``tests/inventory/rust_render.py``; ``tests/inventory/test_live.py`` rebuilds it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from scanner.output import write_text
from tests.inventory.rust_render import build_catalog


def main() -> None:
    parser = argparse.ArgumentParser(description="Build the vLLM Rust render server's catalog.")
    parser.add_argument("--python", required=True, help="Python of the vLLM release")
    parser.add_argument("-o", "--output", default=None, help="catalog file (default: stdout)")
    args = parser.parse_args()
    write_text(args.output, build_catalog(args.python).to_json())


if __name__ == "__main__":
    main()
