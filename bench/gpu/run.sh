#!/usr/bin/env bash
# Issue 25's GPU proof in one call: installs the carried wheels (.whl/, see bench/gpu/README.md), then
# runs python -m bench.gpu.main, which writes $OUT/results.json, $OUT/results.md and (here) $OUT/log.txt.
# Exit 0: every part ran; 1: something failed (listed at the end and in results.json "failures").
# Without CUDA, or with CLUSTERKIT_GPU_REHEARSAL=1, it rehearses the same code with tiny sizes.
#   device:  bash bench/gpu/run.sh                      (carry: [".whl"]; $OUT is set there)
#   here:    OUT=/tmp/gpu-out bash bench/gpu/run.sh     (BENCH_PARTS=node,fsdp for a subset)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
if [ -z "${OUT:-}" ]; then
    echo "bench: set OUT to the folder for the results" >&2
    exit 2
fi
mkdir -p "$OUT" || exit 1
exec > >(tee -a "$OUT/log.txt") 2>&1

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# recipes/ is the package clusterkit.recipes in the wheel (pyproject's package-dir); without an install
# (the device image), a link for this run gives the checkout the same layout.
if [ ! -e clusterkit/recipes ]; then
    ln -s ../recipes clusterkit/recipes || { echo "bench: FAILED: linking clusterkit/recipes"; exit 1; }
    trap 'rm -f clusterkit/recipes' EXIT
fi
site=${BENCH_SITE:-/tmp/clusterkit-bench-site}
# The wheels are for the device image's CPython 3.12 (prepare-wheels.sh checks that they install there).
if compgen -G ".whl/*.whl" >/dev/null && ! python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    echo "bench: .whl/ holds wheels for CPython 3.12, python3 here is $(python3 -V 2>&1): not installed"
elif compgen -G ".whl/*.whl" >/dev/null; then
    wheels=(.whl/*.whl)
    echo "bench: installing ${#wheels[@]} carried wheels into $site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}" \
        || { echo "bench: FAILED: installing the carried wheels (.whl/) failed"; exit 1; }
    export PYTHONPATH="$site:$PYTHONPATH"
fi
# The device machine reaches no network: nothing may wait on the hub. Output unbuffered, so the log
# holds everything up to a timeout.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -c 'import msgspec, jinja2, yaml, rich, torch, transformers, accelerate' \
    || { echo "bench: FAILED: a package clusterkit needs is missing (carry its wheel: bench/gpu/README.md)"; exit 1; }
python3 -m bench.gpu.main
