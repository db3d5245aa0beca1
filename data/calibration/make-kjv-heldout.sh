#!/bin/sh
# Writes kjv-heldout.txt: the King James Bible chapters that kjv-12l did not train on.
# kjv-12l's PROVENANCE.md holds out every document whose index within its source is 7 mod 50
# (0-based, one document per chapter in canonical order); those are the 24 chapters taken
# here, one chapter per paragraph, one verse per line, verse numbers dropped.
# Needs the Debian packages bible-kjv (the `bible` program) and bible-kjv-text.
set -eu
out=${1:-"$(dirname "$0")/kjv-heldout.txt"}
bible -f gen1:1-rev22:21 | awk '
    {
        ref = $1
        sub(/:[0-9]+$/, "", ref)           # "Ge1:1" -> chapter "Ge1"
        if (ref != cur) { cur = ref; ch++ }
        if ((ch - 1) % 50 != 7) next
        sub(/^[^ ]+ /, "")                 # drop the verse reference
        if (ch != last && last) printf "\n"
        last = ch
        print
    }' >"$out.part"
mv "$out.part" "$out"
