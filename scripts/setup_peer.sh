#!/usr/bin/env bash
# scripts/setup_peer.sh: the peer, NVIDIA's kvpress, with transformers and torch, in the project
# venv ($KVLAB_VENV, default .venv/, the one scripts/setup_models.sh makes), for evals/peer/.
#
#   scripts/setup_peer.sh            # from PyPI
#   PEER_WHEELS=DIR scripts/setup_peer.sh   # also look in DIR (wheels fetched earlier with
#                                           # `pip download -d DIR kvpress==0.5.5`)
#
# What it costs (measured on the 2-core development machine, shared with other jobs, see
# docs/models/peer.md): about 3.0 GB of wheels (torch 2.15.0 515 MB, its CUDA 13 libraries
# about 2.1 GB, triton 273 MB, the rest small), about 18 minutes to download here, and 59
# minutes to install from those wheels (6.2 GB venv; mostly waiting on a disk and CPUs that
# other jobs shared). Why not less (investigated, docs/models/peer.md): PyPI serves no CPU-only
# torch for Linux x86_64 (those wheels live on PyTorch's own index, which is not reachable);
# Debian's python3-torch is 1.13, below kvpress's torch>=2.3.1; and torch installed with
# --no-deps does not import: libtorch_python.so and libtorch_cuda.so link cudart, cudnn, cufile,
# cublas, cufft, cusparse, cusparseLt, nccl, nvrtc and nvshmem at load time, so only triton,
# cusolver, cupti, nvtx and curand (about 0.5 GB) could be left out by hand-pinning every wheel.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KVLAB_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
# Pinned: kvpress 0.5.5 wants transformers>=4.56,<5.3 and torch>=2.3.1,<3; h5py for
# evals/peer/kvpress_runner.py (it writes its answers into kvlab's results file).
PKGS=(kvpress==0.5.5 transformers==5.2.0 torch==2.15.0 "gguf==0.19.0" h5py==3.16.0)

if [ ! -x "$PY" ]; then
  /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || apt-get install -y -q python3-venv >/dev/null
  echo "setup_peer: creating $VENV"
  /usr/bin/python3 -m venv "$VENV"
fi
if "$PY" -c 'import kvpress, transformers, torch, gguf, h5py' 2>/dev/null; then
  echo "setup_peer: kvpress $("$PY" -c 'import importlib.metadata as m; print(m.version("kvpress"))'), transformers, torch already in $VENV"
  exit 0
fi
extra=()
[ -n "${PEER_WHEELS:-}" ] && extra=(--find-links "$PEER_WHEELS")
start=$(date +%s)
echo "setup_peer: installing ${PKGS[*]} into $VENV (about 3 GB from PyPI)"
"$PY" -m pip install -q --disable-pip-version-check "${extra[@]}" "${PKGS[@]}"
"$PY" - <<'EOF'
import torch, transformers, kvpress, importlib.metadata as m
torch.set_num_threads(1)
x = torch.ones(4, 4) @ torch.ones(4, 4)
assert float(x.sum()) == 64.0
print(f"setup_peer: kvpress {m.version('kvpress')}, transformers {transformers.__version__}, "
      f"torch {torch.__version__} (CUDA available: {torch.cuda.is_available()})")
EOF
echo "setup_peer: done in $(( $(date +%s) - start )) s; $(du -sh "$VENV" | cut -f1) in $VENV"
