"""The build's one step beyond pyproject.toml: the protobuf and gRPC modules of ``proto/``
are generated (``make proto`` calls ``generate_protos`` too), so a wheel built from a clean
checkout carries them."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def generate_protos(root: Path = ROOT) -> list[Path]:
    """Generates ``proto/*_pb2*.py{,i}`` from ``proto/*.proto`` as modules of ``weir.proto``
    (the files import ``weir/proto/…``: protoc maps that path onto ``proto/``)."""
    from grpc_tools import protoc

    protos = sorted((root / "proto").glob("*.proto"))
    with tempfile.TemporaryDirectory() as out:
        args = ["protoc", f"-Iweir/proto={root / 'proto'}",
                f"-I{Path(protoc.__file__).parent / '_proto'}", f"--python_out={out}",
                f"--grpc_python_out={out}", f"--pyi_out={out}",
                *(f"weir/proto/{p.name}" for p in protos)]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {[p.name for p in protos]}")
        made = sorted(Path(out, "weir", "proto").iterdir())
        for path in made:
            shutil.copyfile(path, root / "proto" / path.name)
    return [root / "proto" / path.name for path in made]


if __name__ == "__main__":
    if sys.argv[1:] == ["generate_protos"]:
        generate_protos()
        raise SystemExit(0)
    from setuptools import setup
    from setuptools.command.build_py import build_py

    class BuildPyWithProtos(build_py):
        """build_py, after generating the protobuf modules into ``proto/``."""

        def run(self) -> None:
            generate_protos()
            super().run()

    setup(cmdclass={"build_py": BuildPyWithProtos})
