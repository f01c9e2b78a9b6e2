#!/usr/bin/env bash
# Structure rules that reviews would otherwise have to catch (DESIGN.md §1, §4):
# 1. loader/src/parquet/ (the own Parquet reader) uses nothing of the rest of
#    the loader: no `crate::` path outside `crate::parquet`.
# 2. No two modules of preprocess/ import each other (root re-exports count
#    as their defining module).
set -euo pipefail
cd "$(dirname "$0")/.."
status=0

outside=$(grep -rhv '^\s*//' loader/src/parquet/ | grep -oE 'crate::[a-z_]+' | grep -v '^crate::parquet$' || true)
if [ -n "$outside" ]; then
  echo "loader/src/parquet/ must not use the rest of the loader; found:"; echo "$outside" | sort -u
  status=1
fi

# Module -> modules it uses, for preprocess (a re-export at the root maps to its module).
declare -A root_item=([PreprocessError]=error [Result]=error [BoxError]=error [ShardOptions]=options
  [Progress]=options [TaskSplit]=options [TaskStage]=options [InputFormat]=input_format
  [ShardSummary]=pipeline [shard]=run [commit]=task [CommitSummary]=task [peak_rss_bytes]=measure
  [files_schema]=input [TokenizeOptions]=tokenize)
declare -A uses
for file in preprocess/src/*.rs; do
  module=$(basename "$file" .rs)
  [ "$module" = lib ] && continue
  deps=""
  # `crate::x::...` and `use crate::{a, b::c}` (first segments), comments dropped.
  for item in $(grep -v '^\s*//' "$file" | grep -oE 'crate::(\{[^}]*\}|[A-Za-z_]+)' \
      | sed -E 's/^crate:://; s/[{}]//g; s/,/ /g' | tr ' ' '\n' | sed -E 's/::.*//' | grep -v '^$'); do
    target=${root_item[$item]:-$item}
    [ -f "preprocess/src/$target.rs" ] && [ "$target" != "$module" ] && deps="$deps $target"
  done
  uses[$module]=$(echo "$deps" | tr ' ' '\n' | sort -u | tr '\n' ' ')
done
for a in "${!uses[@]}"; do
  for b in ${uses[$a]}; do
    if [[ " ${uses[$b]:-} " == *" $a "* ]] && [[ "$a" < "$b" ]]; then
      echo "preprocess: modules $a and $b import each other"; status=1
    fi
  done
done
[ $status -eq 0 ] && echo "structure: ok"
exit $status
