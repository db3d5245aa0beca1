#!/bin/sh
# The main job: generate text from the bundled real model.
set -eu
cd "$(dirname "$0")/.."
exec build/bin/river run --model tests/data/tinystories-656k --prompt "Once upon a time" --max-tokens 64
