#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with what the device image lacks for bench/gpu/run.sh, for its Python 3.12
# on x86-64: clusterkit's msgspec and argcomplete, and DeepSpeed (built here as a pure-Python wheel,
# DS_BUILD_OPS=0: ops JIT-compile there, where nvcc and ninja are) with the requirements it has that
# the image lacks. Then checks that the set installs for cp312 and that every requirement of every
# wheel is either carried or in the image. Run in the repository root that the device call sends:
#   bash bench/gpu/prepare-wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.whl
if ! git check-ignore -q "$dest/x.whl"; then
    echo "prepare-wheels: $dest/ is not ignored by git; add it first: echo /.whl/ >> .git/info/exclude" >&2
    exit 1
fi
DEEPSPEED=0.19.8
# Binary wheels for the image's CPython 3.12 (pydantic-core and msgspec are compiled; the rest are py3).
BINARY=(msgspec==0.22.0 argcomplete==3.7.2 hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5
        annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0)
PLATFORM=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
mkdir -p "$dest"
python3 -m pip download -q --no-deps --only-binary=:all: "${PLATFORM[@]}" -d "$dest" "${BINARY[@]}"
if ! compgen -G "$dest/deepspeed-$DEEPSPEED-py3-none-any.whl" >/dev/null; then
    sdist=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary=:all: -d "$sdist" "deepspeed==$DEEPSPEED"
    # No build isolation: DeepSpeed's setup.py reads the installed torch (any build; no op is compiled).
    DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation -w "$dest" "$sdist"/deepspeed-*.tar.gz
    rm -rf "$sdist"
fi
python3 - "$dest" <<'EOF'
"""One version of each, and every requirement (markers for CPython 3.12 on Linux, extras left out)
met by a carried wheel or by the device image (KINDS.md's package list, 2026-11-17)."""
import re
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

IMAGE = {"einops", "msgpack", "ninja", "numpy", "packaging", "psutil", "py-cpuinfo", "torch", "tqdm", "jinja2", "pyyaml",
         "rich", "transformers", "accelerate", "safetensors", "huggingface-hub", "nvidia-ml-py", "typing-extensions"}
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "implementation_name": "cpython", "os_name": "posix", "extra": ""}
wheels = sorted(Path(sys.argv[1]).glob("*.whl"))
names = [canonicalize_name(w.name.split("-")[0]) for w in wheels]
doubles = {n for n in names if names.count(n) > 1}
missing = []
for wheel in wheels:
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        for line in archive.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:"):
                requirement = Requirement(line.split(":", 1)[1].strip())
                if requirement.marker and not requirement.marker.evaluate(ENV):
                    continue
                name = canonicalize_name(requirement.name)
                if name not in names and name not in IMAGE:
                    missing.append(f"{wheel.name} needs {requirement}")
print(f"prepare-wheels: {len(wheels)} wheels, {sum(w.stat().st_size for w in wheels) / 2**20:.1f} MiB: {', '.join(names)}")
if doubles or missing:
    sys.exit("prepare-wheels: " + "; ".join([f"two versions of {', '.join(sorted(doubles))}"] * bool(doubles) + missing))
EOF
# The install run.sh does there, for cp312 (here that needs the target's tags named).
check=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --only-binary=:all: "${PLATFORM[@]}" --target "$check" "$dest"/*.whl
rm -rf "$check"
echo "prepare-wheels: ready; the device call: command 'bash bench/gpu/run.sh', carry [\".whl\"]"
