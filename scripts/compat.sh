#!/usr/bin/env bash
# The torch version matrix: the compat tier of the test suite on each torch the package allows.
#
#   scripts/compat.sh                 # every minor from the floor to the newest
#   scripts/compat.sh 2.7.1 2.15.0    # only these
#   scripts/compat.sh --install-only 2.7.1 2.15.0   # only make their venvs, torch and the plugin (CI does this beside the
#                                                   # suite: for 2.7.1, and for both with .ci/run --full)
#
# One virtual environment per torch version, outside the repository, reused when it has that torch:
# $COMPAT_VENVS (default ~/.cache/pytest-compilecache-compat/venvs). The plugin is installed into it
# from this checkout each time (editable, so a venv serves one checkout's run at a time). The compat
# tier is the tests marked `compat`: those that reach torch's private API through a path of their own (the
# drift test of every patch of torch; isolation and its counts; bundles built, loaded, updated and merged,
# serially and under -n 2; warm tests; explanations; the command line). The rest of the suite either imports no
# torch or goes through those same paths, and runs on one torch in the full suite.
# One line per version: passed/failed/skipped and wall time; logs in $COMPAT_LOGS (default
# benchmarks/results/compat), one per version, plus summary.txt. Exit status: 1 if any version failed.
# COMPAT_DISCARD=1 removes each venv (a CUDA build, about 5 GB) once its tier has run (CI does this).
# COMPAT_FLOORS=1 makes each venv a floor environment: every dependency pyproject.toml names (the runtime ones,
# pytest-xdist, the s3 and azure extras) at its lowest allowed version, and runs the tests marked `floors` (but
# not `slow`) beside the compat tier. CI does this with the oldest torch: the oldest of everything, together.
# COMPAT_TIER=core runs the tests marked `core` (the compat tier's core) instead of the whole compat tier, as CI does.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
venvs=${COMPAT_VENVS:-$HOME/.cache/pytest-compilecache-compat/venvs}
logs=${COMPAT_LOGS:-$repo/benchmarks/results/compat}
workers=${COMPAT_WORKERS:-2}
python=${PYTHON:-python3}
install_only=0
if [ "${1:-}" = "--install-only" ]; then
  install_only=1
  shift
fi
if [ $# -eq 0 ]; then
  set -- 2.7.1 2.8.0 2.9.1 2.10.0 2.11.0 2.12.1 2.13.0 2.14.1 2.15.0
fi
mkdir -p "$venvs" "$logs"

# Make the venv of torch $1 at $2 where it lacks that torch (only torch: the plugin comes next).
make_venv() {
  local version=$1 venv=$2
  if "$venv/bin/python" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
    return 0
  fi
  rm -rf "$venv"
  "$python" -m venv "$venv" || return 1
  # A CUDA build of several GB for every version but the CPU wheel pip may find on disk; it runs on
  # the CPU. PIP_CONSTRAINT=/dev/null: a machine-wide pip constraint must not refuse the version asked for.
  # --no-compile: the modules a run imports are compiled when first imported, not all of torch's at install.
  PIP_CONSTRAINT=/dev/null "$venv/bin/python" -m pip install -q --no-cache-dir --no-compile "torch==$version" 2>&1 \
    | grep -v "^WARNING: Location"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "installing torch $version into $venv failed"; return 1; }
}

# Every dependency pyproject.toml names, at its lowest allowed version, as pip requirements.
floors() {
  "$python" - "$repo/pyproject.toml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
deps = re.findall(r'"([A-Za-z0-9_.-]+)>=([0-9.]+)"', re.search(r"^dependencies = \[(.*?)\]", text, re.M | re.S).group(1))
deps += re.findall(r'"(pytest-xdist)>=([0-9.]+)"', text)
extras = " ".join(re.search(rf"^{name} = \[(.*?)\]", text, re.M).group(1) for name in ("s3", "azure"))
deps += re.findall(r'"([A-Za-z0-9_.-]+)>=([0-9.]+)"', extras)
print(" ".join(sorted({f"{name}=={version}" for name, version in deps})))
PY
}

# Make (or refresh) the venv of torch $1 at $2, with the plugin and its test extra installed from
# this checkout (editable: a venv serves one checkout's run at a time), and check that it took.
prepare() {
  local version=$1 venv=$2
  make_venv "$version" "$venv" || return 1
  PIP_CONSTRAINT=/dev/null "$venv/bin/python" -m pip install -q -e "$repo[test]" 2>&1 | grep -v "^WARNING: Location"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "installing the plugin from $repo into $venv failed"; return 1; }
  if [ "${COMPAT_FLOORS:-0}" = 1 ]; then
    local floors
    floors=$(floors) || return 1
    echo "dependency floors: $floors"
    PIP_CONSTRAINT=/dev/null "$venv/bin/python" -m pip install -q $floors 2>&1 | grep -v "^WARNING: Location"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "installing the dependency floors into $venv failed"; return 1; }
    # s3fs's floor brings an older botocore; boto3 (moto's) must be its match, or moto.server cannot be imported
    # and every S3 test would be skipped: the import is checked below
    PIP_CONSTRAINT=/dev/null "$venv/bin/python" -m pip install -q \
      "boto3==$("$venv/bin/python" -c 'import botocore; print(botocore.__version__)')" 2>&1 | grep -v "^WARNING: Location"
    "$venv/bin/python" -c "import moto.server, s3fs, adlfs" || { echo "the floors' S3 and Azure clients do not import"; return 1; }
  fi
  (cd / && "$venv/bin/python" -c "
import os, sys, torch, pytest_compilecache
where = os.path.realpath(pytest_compilecache.__file__)
print('torch', torch.__version__, 'plugin from', os.path.dirname(where))
sys.exit(not where.startswith(os.path.realpath('$repo') + os.sep))") || { echo "the plugin in $venv is not this checkout's"; return 1; }
}

if [ "$install_only" = 1 ]; then
  for version in "$@"; do
    prepare "$version" "$venvs/torch-$version" || exit 1
  done
  exit 0
fi

selection=${COMPAT_TIER:-compat}
case "$selection" in
  compat|core) ;;
  *) echo "COMPAT_TIER is compat (the default) or core, not '$selection'" >&2; exit 2 ;;
esac
[ "${COMPAT_FLOORS:-0}" = 1 ] && selection="$selection or (floors and not slow)"
summary="$logs/summary.txt"
: > "$summary"
failed=0
for version in "$@"; do
  venv="$venvs/torch-$version"
  log="$logs/torch-$version.log"
  start=$(date +%s)
  {
    echo "# scripts/compat.sh $version at $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?') on $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
    prepare "$version" "$venv" && cd "$repo" && "$venv/bin/python" -m pytest tests -q -p no:cacheprovider -m "$selection" \
      -n "$workers" --dist worksteal -W "ignore::DeprecationWarning" -W "ignore::UserWarning" -rfEs --durations=10
  } > "$log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  outcome=$(grep -E "^=* ?[0-9]+ (passed|failed)|^=+ .*(passed|failed|error).* in " "$log" | tail -1 | sed -E 's/=//g; s/^ +| +$//g')
  [ -n "$outcome" ] || outcome="no result (rc $rc, see the log)"
  [ "$rc" -eq 0 ] || failed=1
  [ "${COMPAT_DISCARD:-0}" = 1 ] && rm -rf "$venv"
  line=$(printf "torch %-7s %-6s %-60s %4d s  %s" "$version" "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)" "$outcome" "$seconds" "${log#"$repo/"}")
  echo "$line" | tee -a "$summary"
done
exit $failed
