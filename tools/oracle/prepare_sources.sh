#!/bin/bash
# Extracts the modelling code the oracle recorder runs (transformers, peft and the pure-Python
# packages they import) from snapshots fetched into /work/.mirror, into a scratch folder that is
# never committed. Usage: tools/oracle/prepare_sources.sh [DEST]   (default /tmp/memsim-oracle-src)
# The snapshots (git directories) come from the session's fetch tool:
#   github:F4biian/transformers-v4.47.1-and-internal-states  (a fork that keeps upstream history)
#   github:huggingface/peft  github:huggingface/huggingface_hub  github:huggingface/accelerate
# Versions (all compatible with Debian 12's python3-torch 1.13, CPU):
#   transformers 0864dd3beb238b7bec3528a3d1d6c17a28f51a51 (upstream main, 4.36.0.dev0, 2023-11-28)
#   peft v0.7.1, huggingface_hub v0.19.4, accelerate v0.25.0
#   Megatron-LM core_v0.10.0: megatron/core/transformer/moe/moe_utils.py only, into
#   DEST/megatron_core_v0_10/ (snapshot github:NVIDIA/Megatron-LM; megatron_moe.py loads it)
# safetensors (Rust) is replaced by a stub: the recorder never loads or saves weights.
# Debian packages the imports need: python3-regex python3-filelock python3-tqdm python3-packaging
# python3-fsspec python3-yaml python3-numpy python3-requests python3-psutil python3-torch.
set -euo pipefail
MIRROR=${MIRROR:-/work/.mirror}
DEST=${1:-/tmp/memsim-oracle-src}
rm -rf "$DEST"
mkdir -p "$DEST"

extract() {  # extract REPO_DIR REV SUBDIR PKG VERSION
  local git="$MIRROR/$1/repo" rev=$2 sub=$3 pkg=$4 version=$5
  [[ -d "$git" ]] || { echo "missing snapshot $git: fetch github:${1/+//} first" >&2; exit 1; }
  git --git-dir="$git" archive "$rev" "$sub/$pkg" | tar -x -C "$DEST" --strip-components=1
  # importlib.metadata finds the version here (transformers' dependency_versions_check).
  local dist="$DEST/${pkg}-${version}.dist-info"
  mkdir -p "$dist"
  printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "${6:-$pkg}" "$version" >"$dist/METADATA"
}

extract F4biian+transformers-v4.47.1-and-internal-states \
  0864dd3beb238b7bec3528a3d1d6c17a28f51a51 src transformers 4.36.0.dev0
extract huggingface+peft v0.7.1 src peft 0.7.1
extract huggingface+huggingface_hub v0.19.4 src huggingface_hub 0.19.4 huggingface-hub
extract huggingface+accelerate v0.25.0 src accelerate 0.25.0

mkdir -p "$DEST/megatron_core_v0_10"
git --git-dir="$MIRROR/NVIDIA+Megatron-LM/repo" show \
  core_v0.10.0:megatron/core/transformer/moe/moe_utils.py >"$DEST/megatron_core_v0_10/moe_utils.py"

# The safetensors stub: the names transformers, peft and accelerate import at module level.
mkdir -p "$DEST/safetensors" "$DEST/safetensors-0.4.1.dist-info"
printf 'Metadata-Version: 2.1\nName: safetensors\nVersion: 0.4.1\n' \
  >"$DEST/safetensors-0.4.1.dist-info/METADATA"
cat >"$DEST/safetensors/__init__.py" <<'PY'
"""Stub: the oracle loads and saves no weights."""
__version__ = "0.4.1"
class SafetensorError(Exception):
    pass
def safe_open(*args, **kwargs):
    raise SafetensorError("safetensors stub: no weights in the oracle")
PY
cat >"$DEST/safetensors/torch.py" <<'PY'
"""Stub: the oracle loads and saves no weights."""
def _unavailable(*args, **kwargs):
    raise RuntimeError("safetensors stub: no weights in the oracle")
load_file = save_file = load = save = save_model = load_model = storage_ptr = storage_size = _unavailable
PY
echo "$DEST"
