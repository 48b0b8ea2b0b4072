#!/usr/bin/env bash
# Do two torch builds sharing one Redis remote cache mix entries? Runs one compiled test with
# --compile-cache-remote under PYTHON_A, then PYTHON_B, then PYTHON_A again, each with an empty
# local cache, and prints each run's remote FX graph and AOTAutograd counts.
#   bash benchmarks/probe/remote_builds.sh /path/to/venv-a/bin/python /path/to/venv-b/bin/python
# Seen 2026-11-24 (torch 2.13.0+cpu and 2.15.0+cu132 on CPU): B misses what A put, A hits its own.
set -euo pipefail
a=$1 b=$2
work=$(mktemp -d)
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes >/dev/null
sleep 1
cat > "$work/test_mix.py" <<'PY'
import torch

def test_plain():
    with torch.no_grad():
        torch.compile(lambda x: torch.sin(x) * 5 + 2, dynamic=False)(torch.randn(16))
PY
cd "$work"
for py in "$a" "$b" "$a"; do
  rm -rf local
  TORCHINDUCTOR_CACHE_DIR="$work/local" "$py" -m pytest -q -p no:cacheprovider test_mix.py -W ignore \
    --compile-cache-remote="redis://127.0.0.1:$port/0" --compile-cache-report=r.json >/dev/null
  "$py" -c "import json, torch; t = json.load(open('r.json'))['tests']['test_mix.py::test_plain']; \
print(torch.__version__, 'remote FX', t['remote_fx_graph'], 'remote AOT', t['remote_aot_autograd'])"
done
