"""``python -m models build --out DIR``: write every bundled model and print the paths.

Writes ``mobilenet.onnx``, ``transformer.onnx``, ``mobilenet.tflite`` (batch 1, NHWC) and
``transformer_b1_s128.tflite``. ``--sha256`` also prints each file's digest.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import models


def _build(out: Path, names: list[str], with_sha: bool) -> int:
    written: list[Path] = []
    for name in names:
        written.append(models.build_onnx(name, out / f"{name}.onnx"))
    for name in names:
        dims = models.default_shapes(name)
        written.append(models.build_tflite(name, out / models.tflite_filename(name, dims), dims))
    for path in written:
        if with_sha:
            print(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path}")
        else:
            print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m models", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write the bundled models (.onnx and .tflite)")
    b.add_argument("--out", required=True, type=Path, help="output directory (created)")
    b.add_argument("--model", action="append", choices=models.BUNDLED,
                   help="only this model (repeatable); default: all")
    b.add_argument("--sha256", action="store_true", help="print 'sha256  path' lines")
    sub.add_parser("list", help="print the bundled model names")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        print("\n".join(models.BUNDLED))
        return 0
    return _build(args.out, args.model or list(models.BUNDLED), args.sha256)


if __name__ == "__main__":
    sys.exit(main())
