#!/usr/bin/env bash
# Copy this worktree's code (no .git, no bench/results) and SmolLM2's tokenizer into the main checkout's git-ignored
# .h16/ folder, which the device tool carries (the tool ships the main checkout, not a worktree).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MAIN=${MAIN:-/work/main}
TOKENIZER=${TOKENIZER:-$HOME/.cache/sglang-inkling-backend/models/smollm2-135m-instruct}
rm -rf "$MAIN/.h16"
mkdir -p "$MAIN/.h16/tok"
(cd "$HERE" && tar -c --exclude=.git --exclude=bench/results --exclude=__pycache__ --exclude='*.egg-info' \
    --exclude=docs --exclude=.venv .) | tar -x -C "$MAIN/.h16"
cp "$TOKENIZER"/tokenizer.json "$TOKENIZER"/tokenizer_config.json "$MAIN/.h16/tok/"
du -sh "$MAIN/.h16" "$MAIN/.gpu"
