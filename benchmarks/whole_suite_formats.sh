#!/bin/bash
# Whole warm suite of 60 generated tests, alternating rounds: bundle format 2 (this checkout) against
# format 1 (the package of 8fc84dd copied into bench-before/, which git ignores) and a kept folder.
# Run from anywhere: bash benchmarks/whole_suite_formats.sh (about 6 minutes on 2 cores).
source "${VENV:-/work/venvs/t213}/bin/activate"  # a venv with torch and this checkout installed
export PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")"; BEFORE="$(cd .. && pwd)/bench-before"
rm -rf /tmp/ab/new /tmp/ab/old /tmp/ab/kept /tmp/ab/kept-cache /tmp/ab/*.bundle /tmp/ab/xdg*
python -c "
from pathlib import Path
from small_tests_vs_kept import suite
suite(Path('/tmp/ab/new'), 0, 60, plugin=True)
suite(Path('/tmp/ab/old'), 0, 60, plugin=True)
suite(Path('/tmp/ab/kept'), 0, 60, plugin=False)
"
Q="-q -p no:cacheprovider -p no:randomly -W ignore::DeprecationWarning"
t() { local s=$(date +%s.%N); "$@" > /dev/null 2>&1; local e=$(date +%s.%N); python -c "print(f'{$e-$s:.2f}')"; }
echo "build new $(cd /tmp/ab/new && XDG_CACHE_HOME=/tmp/ab/xdg-new t python -m pytest $Q --compile-cache-bundle=/tmp/ab/new.bundle)"
echo "build old $(cd /tmp/ab/old && XDG_CACHE_HOME=/tmp/ab/xdg-old PYTHONPATH=$BEFORE t python -m pytest $Q --compile-cache-bundle=/tmp/ab/old.bundle)"
echo "build kept $(cd /tmp/ab/kept && TORCHINDUCTOR_CACHE_DIR=/tmp/ab/kept-cache t python -m pytest $Q -p no:compilecache)"
ls -la /tmp/ab/*.bundle
for r in 1 2 3 4 5; do
  order="new old kept"; [ $((r % 2)) = 0 ] && order="kept old new"
  for side in $order; do
    case $side in
      new) s=$(cd /tmp/ab/new && XDG_CACHE_HOME=/tmp/ab/xdg-new t python -m pytest $Q --compile-cache-bundle=/tmp/ab/new.bundle $MODE);;
      old) s=$(cd /tmp/ab/old && XDG_CACHE_HOME=/tmp/ab/xdg-old PYTHONPATH=$BEFORE t python -m pytest $Q --compile-cache-bundle=/tmp/ab/old.bundle $MODE);;
      kept) s=$(cd /tmp/ab/kept && TORCHINDUCTOR_CACHE_DIR=/tmp/ab/kept-cache t python -m pytest $Q -p no:compilecache $MODE);;
    esac
    echo "round $r $side $s"
  done
done
