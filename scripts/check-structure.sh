#!/usr/bin/env bash
# Structure rules that reviews would otherwise have to catch (DESIGN.md §1, §4):
# 1. loader/src/parquet/ (the own Parquet reader) uses nothing of the rest of
#    the loader: no `crate::` path outside `crate::parquet`.
# 2. No two modules of preprocess/ import each other (root re-exports count
#    as their defining module).
# 3. No circle of imports among the modules of loader/src/ (a module and its
#    folder count as one; root re-exports count as their defining module;
#    tests are left out).
# 4. Every `unsafe` block or impl has a `// SAFETY:` comment on it or within
#    the six lines above it.
# 5. No file of loader/src/ is over 1,200 lines, and loader/src/pipeline.rs
#    (which only wires the stages) is under 500.
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
# 3. Circles among loader/src/ modules.
if ! python3 - <<'PY'
import glob, os, re, sys
root = "loader/src"
mods = {}
for path in glob.glob(root + "/*.rs"):
    name = os.path.basename(path)[:-3]
    if name != "lib":
        mods[name] = [path] + glob.glob(f"{root}/{name}/**/*.rs", recursive=True)
lib = open(root + "/lib.rs").read()
reexport = {}
for m in re.finditer(r"pub use (\w+)::\{([^}]*)\}", lib):
    for item in m.group(2).replace("\n", " ").split(","):
        item = item.strip().split(" as ")[0].strip()
        if item:
            reexport[item] = m.group(1)
for m in re.finditer(r"pub use (\w+)::(\w+);", lib):
    reexport[m.group(2)] = m.group(1)
graph = {}
for name, files in mods.items():
    deps = set()
    for f in files:
        text = "\n".join(l for l in open(f).read().split("\n") if not l.strip().startswith("//"))
        cut = text.find("#[cfg(test)]\nmod tests")
        if cut >= 0:
            text = text[:cut]
        for m in re.finditer(r"crate::(\{[^}]*\}|[A-Za-z_]+)", text):
            for item in re.sub(r"[{}]", " ", m.group(1)).replace(",", " ").split():
                target = reexport.get(item.split("::")[0], item.split("::")[0])
                if target in mods and target != name:
                    deps.add(target)
    graph[name] = deps
# Tarjan's strongly connected components: any of more than one module is a circle.
index, low, stack, on, found = {}, {}, [], set(), []
sys.setrecursionlimit(10000)
def visit(v, counter=[0]):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in graph[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            found.append(sorted(comp))
for v in sorted(graph):
    if v not in index:
        visit(v)
for comp in found:
    print("loader/src: modules import each other in a circle:", " ".join(comp))
sys.exit(1 if found else 0)
PY
then
  status=1
fi

# 4. `unsafe` without a SAFETY comment.
unsafe_sites=$(find loader/src preprocess/src format/src cli/src python/src fixtures/src -name '*.rs' -print0 \
  | xargs -0 awk '
      FNR == 1 { delete seen }
      { seen[FNR] = $0 }
      /unsafe[ ]*\{|unsafe impl/ && $0 !~ /^[ \t]*\/\// {
        ok = 0
        for (i = FNR; i > FNR - 7 && i > 0; i--) if (seen[i] ~ /SAFETY/) ok = 1
        if (!ok) print FILENAME ":" FNR ": " $0
      }')
if [ -n "$unsafe_sites" ]; then
  echo "unsafe without a // SAFETY: comment on it or in the six lines above:"; echo "$unsafe_sites"
  status=1
fi
# 5. File sizes.
long=$(find loader/src -name '*.rs' -print0 | xargs -0 wc -l | awk '$2 != "total" && $1 > 1200 { print $2 ": " $1 " lines" }')
if [ -n "$long" ]; then
  echo "loader/src files over 1,200 lines (split them by what they own):"; echo "$long"
  status=1
fi
if [ "$(wc -l < loader/src/pipeline.rs)" -ge 500 ]; then
  echo "loader/src/pipeline.rs is 500 lines or more: stage loops belong in their stage's file"
  status=1
fi
# 6. Every repository path ARCHITECTURE.md names (in backquotes, with a slash) exists.
missing=$(grep -o '`[A-Za-z0-9_./-]*/[A-Za-z0-9_./-]*`' ARCHITECTURE.md | tr -d '`' | sort -u \
  | while read -r path; do [ -e "$path" ] || echo "$path"; done)
if [ -n "$missing" ]; then
  echo "ARCHITECTURE.md names paths that do not exist:"; echo "$missing"
  status=1
fi
# 7. Every relative link in the README, the top-level documents and docs/ resolves, and so
#    does its anchor (`file.md#heading`, `#heading`): a heading of the target, as GitHub and
#    mdBook make ids (lower case, spaces to dashes, punctuation dropped, repeats numbered).
broken=$(python3 - <<'PY'
import os, re
files = ["README.md", "ARCHITECTURE.md", "CHANGELOG.md", "BENCHMARKS.md"]
files += [os.path.join(d, f) for d, _, fs in os.walk("docs") for f in fs if f.endswith(".md")]
anchors = {}
def ids(path):
    if path not in anchors:
        seen, out = {}, set()
        text = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
        for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
            title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
            slug = "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
        anchors[path] = out
    return anchors[path]
for path in files:
    text = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
    for m in re.finditer(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        target, anchor = m.group(1), m.group(2)
        if re.match(r"[a-z]+:", target):
            continue
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
        if not os.path.exists(resolved):
            print(f"{path}: {target}")
        elif anchor and resolved.endswith(".md") and anchor not in ids(resolved):
            print(f"{path}: {target}#{anchor} (no such heading)")
PY
)
if [ -n "$broken" ]; then
  echo "links that do not resolve:"; echo "$broken"
  status=1
fi
# 8. The guide's Python API reference is the one the stubs and sources make.
if ! python3 scripts/python-reference.py --check; then
  status=1
fi
[ $status -eq 0 ] && echo "structure: ok"
exit $status
