#!/bin/sh
# The main job: generate text from the bundled real model (TinyStories-656K, from its
# Hugging Face safetensors and tokenizer.json), streamed as it is produced.
set -eu
cd "$(dirname "$0")/.."
model=tests/data/tinystories-656k
prompt="Once upon a time"
echo "== River demo: $model, greedy, 96 tokens"
printf '%s' "$prompt"
${BUILD:-build}/bin/river run --model "$model" --prompt "$prompt" --max-tokens 96
