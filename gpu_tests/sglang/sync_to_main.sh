#!/usr/bin/env bash
# Copy this checkout's code (no .git, no bench/results, no docs) and SmolLM2's tokenizer into the main checkout's git-ignored
# .h16/ folder, which the device tool carries (the tool ships the main checkout, not a worktree).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MAIN=${MAIN:-/work/main}
TOKENIZER=${TOKENIZER:-$HOME/.cache/sglang-inkling-backend/models/smollm2-135m-instruct}
rm -rf "$MAIN/.h16"
mkdir -p "$MAIN/.h16/tok"
# The checkout's own files (tracked, and untracked ones git does not ignore): never .h16 itself, the venvs or other
# ignored folders, whichever checkout this runs from.
(cd "$HERE" && git ls-files -co --exclude-standard -z -- . ':!bench/results' ':!docs' \
    | tar --null -T - -c) | tar -x -C "$MAIN/.h16"
cp "$TOKENIZER"/tokenizer.json "$TOKENIZER"/tokenizer_config.json "$MAIN/.h16/tok/"
du -sh "$MAIN/.h16" "$MAIN/.gpu"
