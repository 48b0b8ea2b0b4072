#!/usr/bin/env bash
# The main job: set everything up in a new virtual environment, then run the examples suite twice
# with two xdist workers and one bundle path: first cold (the warmup compiles once and the bundle is
# written), then warm (the bundle is loaded; nothing known is compiled). Each run ends with the
# plugin's summary; the warm one compares its compile time with the cold one's.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q torch==2.13.0 -e '.[test]'
bundle=.compile-cache/examples.bundle
rm -f "$bundle"
for run in cold warm; do
  echo "=================== $run run ==================="
  python -m pytest examples -n 2 -p no:cacheprovider -W ignore::DeprecationWarning \
    --compile-cache-bundle="$bundle" --compile-cache-report=".compile-cache/report-$run.json"
done
pytest-compilecache inspect "$bundle"
