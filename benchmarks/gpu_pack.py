"""Pack what a lent GPU machine needs for ``benchmarks/gpu_check.py``, under the device tool's 64 MiB transfer.

That machine has Python 3.12, a CUDA torch, e3nn, torch-geometric, transformers, peft, scipy, scikit-learn, pandas and
httpx, and no package index (``../shared/notes/gpu.md``). One transfer cannot hold every domain: the wheels of the
atomistic, ECG, features, graphs and physio domains with cuEquivariance's CUDA kernels fill most of it, the EEG and
medvl extras another. So there are two sets, each one transfer and one ``gpu_check`` call:

- ``core``: rmd17 (e3nn and cueq), ptbxl, csbm, features, physio, and every part of the check;
- ``eeg-medvl``: sleepedf, motor-imagery and medvl (the ``commands`` and ``epochs`` parts).

Into ``gpu-pack/`` (ignored by git) it writes ``project.tar.xz`` (the tracked files the check uses: no tests, docs,
notebooks or results, and only the embedded data and checkpoints of the set's domains), ``wheels/`` (the Python 3.12
wheels that machine lacks, downloaded once into ``~/.cache/workbench/gpu-wheels``), for ``core`` ``ops.tar.xz``
(cuEquivariance's CUDA kernels unpacked, with the Triton caches of other GPU generations left out) and ``run.sh``
(installs into ``/tmp``, runs the check, writes ``$OUT/gpu_check.json`` and its log). It refuses a pack over the limit.

The transfer holds the working tree too, so ``--stage`` then takes every tracked file out of the working tree (it
refuses uncommitted changes: git has them all), leaving the pack. Then, in the session:

    python benchmarks/gpu_pack.py --set core --stage
    # the device tool:  run(command="bash gpu-pack/run.sh", carry=["gpu-pack"], timeout_s=600)
    git checkout -- . && rm -rf gpu-pack          # the working tree back
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "gpu-pack"
CACHE = Path.home() / ".cache" / "workbench" / "gpu-wheels"
#: What one transfer may hold [bytes], less room for the working tree's few untracked files.
LIMIT = 64 * 2**20 - 2**20
#: The wheels the GPU machine lacked (Python 3.12, torch 2.11 + CUDA 13; `../shared/notes/gpu-wheels.txt`).
WHEELS = {
    "core": [
        "mace-torch==0.3.16", "e3nn==0.4.4", "ase==3.29.0", "matscipy==1.3.1", "torch-ema==0.3", "prettytable==3.19.0",
        "wcwidth==0.9.4", "configargparse==1.9.0", "gitpython==3.2.1", "gitdb==4.0.12", "smmap==5.0.3",
        "lmdb==3.0.0", "orjson==3.13.0", "python-hostlist==2.3.0", "platformdirs==4.14.9", "cuequivariance==0.13.0",
        "cuequivariance-torch==0.13.0", "pot==0.9.6.post1", "wfdb==4.3.1", "soundfile==0.14.0", "cffi==2.1.1",
        "pycparser==3.12", "neurokit2==0.2.13", "pywavelets==1.10.0", "densratio==0.4.0",
        # the serve extra (not listed in gpu-wheels.txt: serve had not run there; httpx, anyio and h11 were present)
        "fastapi==0.165.0", "starlette==1.10.0", "uvicorn==0.55.0", "python-multipart==0.0.34", "click==8.5.1",
        "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
    ],
    "eeg-medvl": [
        "mne==1.13.2", "braindecode==1.8.1", "mne-bids==0.20.0", "skorch==1.4.0", "torchinfo==1.8.0",
        "linear-attention-transformer==0.19.1", "linformer==0.2.3", "local-attention==1.11.2",
        "product-key-memory==0.3.0", "axial-positional-embedding==0.3.12", "hyper-connections==0.4.11",
        "colt5-attention==0.11.2", "torch-einops-utils==0.2.0", "docstring-inheritance==3.0.0", "pydantic==2.14.4",
        "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5", "decorator==5.3.1",
        "pooch==1.9.0", "edfio==0.4.18", "platformdirs==4.14.9", "monai==1.6.1", "pydicom==3.0.2", "nibabel==5.4.2",
        "wfdb==4.3.1", "soundfile==0.14.0", "cffi==2.1.1", "pycparser==3.12", "pot==0.9.6.post1",
    ],
}  # fmt: skip
#: cuEquivariance's CUDA kernels for torch 2.11 + CUDA 13 (``core`` only).
OPS = ["cuequivariance-ops-torch-cu13==0.13.0", "cuequivariance-ops-cu13==0.13.0"]
#: The domains of each set, and the tracked folders only they use (left out of the other set's project).
DOMAINS = {
    "core": ("rmd17", "ptbxl", "csbm", "features", "physio"),
    "eeg-medvl": ("sleepedf", "motor-imagery", "medvl"),
}
ONLY = {
    "core": ("domains/atomistic/embedded", "domains/ecg/embedded", "domains/physio/embedded", "models/checkpoints/mace",
             "models/checkpoints/ecg", "models/checkpoints/patch_gpt", "models/checkpoints/physiopfm"),
    "eeg-medvl": ("domains/eeg/embedded", "domains/medvl/embedded", "models/checkpoints/labram",
                  "models/checkpoints/medvl"),
}  # fmt: skip
#: Never needed on the GPU machine.
LEFT_OUT = ("tests/", "docs/", "notebooks/", "benchmarks/results/", ".ci/", "data_cards/figures/")
PARTS = {"core": "readme,commands,compare,serve,mace_step,partial_ot,htuning_memory,epochs",
         "eeg-medvl": "commands,epochs"}


def tracked_files(chosen: str) -> list[str]:
    """The tracked files the set's check needs."""
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    other = next(name for name in ONLY if name != chosen)
    return [n for n in names if not n.startswith(LEFT_OUT) and not n.startswith(ONLY[other]) and (ROOT / n).is_file()]


def download(requirements: list[str], folder: Path) -> list[Path]:
    """The Python 3.12 manylinux wheels of ``requirements`` (cached); an sdist-only package is built into a wheel."""
    folder.mkdir(parents=True, exist_ok=True)
    wheels = []
    for requirement in requirements:
        name = requirement.split("==")[0].replace("-", "_").lower()
        found = [w for w in folder.glob("*.whl") if w.name.lower().startswith(f"{name}-{requirement.split('==')[1]}-")]
        if not found:
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                       "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                       "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "--platform",
                       "any", "-d", str(folder), requirement]  # fmt: skip
            if subprocess.run(command).returncode != 0:  # no wheel published: build one from the sdist
                subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(folder),
                                requirement], check=True)  # fmt: skip
            found = [w for w in folder.glob("*.whl") if w.name.lower().startswith(f"{name}-")]
        if not found:
            sys.exit(f"gpu_pack: no wheel of {requirement} in {folder}")
        wheels.append(found[0])
    return wheels


def ops_archive(out: Path, arch: str) -> None:
    """cuEquivariance's CUDA kernels unpacked into one tree, the Triton caches of other compute capabilities than
    ``arch`` left out, packed with xz -9 (cached beside the wheels)."""
    cached = CACHE / f"ops-{arch}.tar.xz"
    if not cached.is_file():
        with tempfile.TemporaryDirectory() as scratch:
            site = Path(scratch) / "site"
            for wheel in download(OPS, CACHE):
                with zipfile.ZipFile(wheel) as archive:
                    archive.extractall(site)
            for cache in site.glob("cuequivariance_ops/triton/cache/*.json"):
                if not cache.name.endswith(f".{arch}.json"):
                    cache.unlink()
            subprocess.run(["tar", "-cf", str(cached.with_suffix("")), "-C", str(site), "."], check=True)
            subprocess.run(["xz", "-9", "-T0", "-f", str(cached.with_suffix(""))], check=True)
    shutil.copy(cached, out)


RUN_SH = """#!/usr/bin/env bash
# On the GPU machine (by benchmarks/gpu_pack.py --set {chosen}): install into /tmp, run the check, results in $OUT.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${{OUT:-$here/out}}"; mkdir -p "$out" /tmp/wb /tmp/site
tar -xJf "$here/project.tar.xz" -C /tmp/wb
python3 -m pip install --quiet --no-index --no-deps --target /tmp/site "$here"/wheels/*.whl
if [ -f "$here/ops.tar.xz" ]; then tar -xJf "$here/ops.tar.xz" -C /tmp/site; fi
export PYTHONPATH=/tmp/site
python3 -m pip install --quiet --no-index --no-deps --no-build-isolation -e /tmp/wb
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" || true
cd /tmp/wb
python3 benchmarks/gpu_check.py --parts {parts} --domains {domains} --json "$out/gpu_check-{chosen}.json" 2>&1 \\
  | tee "$out/console.txt"
"""


def pack(chosen: str, arch: str) -> int:
    """Write ``gpu-pack/`` for the set ``chosen``; its size [bytes]."""
    if PACK.exists():
        shutil.rmtree(PACK)
    (PACK / "wheels").mkdir(parents=True)
    with tarfile.open(PACK / "project.tar.xz", "w:xz", preset=9) as archive:
        for name in tracked_files(chosen):
            archive.add(ROOT / name, arcname=name)
    for wheel in download(WHEELS[chosen], CACHE):
        shutil.copy(wheel, PACK / "wheels" / wheel.name)
    if chosen == "core":
        ops_archive(PACK / "ops.tar.xz", arch)
    (PACK / "run.sh").write_text(RUN_SH.format(chosen=chosen, parts=PARTS[chosen], domains=",".join(DOMAINS[chosen])))
    return sum(path.stat().st_size for path in PACK.rglob("*") if path.is_file())


def stage() -> None:
    """Take every tracked file but ``.gitignore`` out of the working tree (git holds them), so that the transfer
    holds the pack."""
    changes = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    if changes.strip():
        sys.exit("gpu_pack --stage: commit or stash first; uncommitted changes to tracked files:\n" + changes)
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        if name != ".gitignore":  # it keeps .venv/ and the like out of the transfer (and gpu-pack/: carried)
            (ROOT / name).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(DOMAINS), default="core", dest="chosen")
    parser.add_argument("--arch", default="9.0", help="compute capability whose Triton caches are kept (H200: 9.0)")
    parser.add_argument("--stage", action="store_true", help="then take the tracked files out of the working tree")
    args = parser.parse_args(argv)
    size = pack(args.chosen, args.arch)
    sizes = {path.name: path.stat().st_size for path in PACK.iterdir() if path.is_file()}
    sizes["wheels/"] = sum(path.stat().st_size for path in (PACK / "wheels").iterdir())
    print("\n".join(f"  {name:16s} {value / 2**20:6.1f} MiB" for name, value in sizes.items()))
    print(f"gpu-pack/ ({', '.join(DOMAINS[args.chosen])}): {size / 2**20:.1f} MiB of {LIMIT / 2**20:.0f} MiB")
    if size > LIMIT:
        sys.exit("gpu_pack: over the transfer limit; nothing staged")
    if args.stage:
        stage()
        print("tracked files taken out of the working tree (git checkout -- . brings them back)")
    print('then: run(command="bash gpu-pack/run.sh", carry=["gpu-pack"], timeout_s=600); afterwards: '
          "git checkout -- . && rm -rf gpu-pack")  # fmt: skip


if __name__ == "__main__":
    main()
