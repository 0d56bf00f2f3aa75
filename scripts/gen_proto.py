#!/usr/bin/env python3
"""Regenerate the checked-in gRPC stubs from src/adx/proto/*.proto, or check that they are current.

uv run python scripts/gen_proto.py          # rewrite the stubs
uv run python scripts/gen_proto.py --check  # exit 1 if any stub is stale or missing (CI)
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
BIN = Path(sys.executable).parent


def generate(src: Path, out_dir: Path) -> list[Path]:
    protos = sorted((src / "adx" / "proto").glob("*.proto"))
    if not protos:
        return []
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{src}",
        f"-I{include}",
        # mypy-protobuf's plugins give typed stubs for both messages and gRPC services (mypy strict).
        f"--plugin=protoc-gen-mypy={BIN / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={BIN / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *(str(p.relative_to(src)) for p in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out_dir / "adx" / "proto").iterdir())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if checked-in stubs differ from fresh ones")
    parser.add_argument("--src", type=Path, default=SRC, help="source root holding adx/proto (default: src)")
    args = parser.parse_args()
    proto_dir = args.src / "adx" / "proto"
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(args.src, Path(tmp))}
        existing = {p.name: p for p in proto_dir.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}
        stale = sorted(
            name
            for name in fresh.keys() | existing.keys()
            if name not in fresh or name not in existing or not filecmp.cmp(fresh[name], existing[name], shallow=False)
        )
        if args.check:
            if stale:
                print(f"stale gRPC stubs (run scripts/gen_proto.py): {', '.join(stale)}", file=sys.stderr)
                return 1
            print(f"gRPC stubs are current ({len(fresh)} files)")
            return 0
        for name in stale:
            if name in fresh:
                shutil.copyfile(fresh[name], proto_dir / name)
            else:
                (proto_dir / name).unlink()
        print(f"regenerated {len(stale)} of {len(fresh)} stub files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
