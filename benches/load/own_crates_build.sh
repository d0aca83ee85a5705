#!/usr/bin/env bash
# The release-build cost of Corvid's own crates, from scratch, in each tree given, one after the
# other, in one target directory whose dependencies are already built (so only our crates
# compile). A tree is a checkout of this repository; its own crates are the workspace members.
#   benches/load/own_crates_build.sh /path/to/tree-b /path/to/tree-a
# Prints wall and CPU seconds per tree and the CPU ratio of the last tree to the first.
set -euo pipefail
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/corvid-target}"
first=""
for tree in "$@"; do
  cd "$tree"
  packages=$(cargo metadata --no-deps --format-version 1 |
    python3 -c 'import json,sys; print(" ".join("-p " + p["name"] for p in json.load(sys.stdin)["packages"]))')
  cargo build --release -q # dependencies (and our crates) up to date first
  cargo clean --release -q $packages
  out=$( { /usr/bin/time -f "%e %U %S" cargo build --release -q; } 2>&1 | tail -1)
  read -r wall user sys <<<"$out"
  cpu=$(python3 -c "print(round($user + $sys, 1))")
  echo "$tree ($(git -C "$tree" log --oneline -1 | cut -c1-12)): wall ${wall} s, CPU ${cpu} s"
  [ -z "$first" ] && first=$cpu
done
python3 -c "print(f'CPU ratio, last tree / first: {$cpu / $first:.2f}')"
