"""``pytest-compilecache`` / ``python -m pytest_compilecache``: inspect, verify, merge and prune bundles."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence, TextIO

from . import _torchapi
from .bundle import signing
from ._torchapi.layout import is_cpp
from .bundle.binaries import build_id, identity_differences
from .bundle.format import FORMAT, Bundle, BundleError, Entry, read_manifest
from .bundle.labels import differences, env_label, printable
from .bundle.pruning import prune
from .session.options import user_cache_dir
from .storage.errors import DEFAULT_TIMEOUT as DEFAULT_NETWORK_TIMEOUT
from .storage.errors import MIN_RATE
from .storage.interface import BundleStore
from .bundle.merge import merge_input, merged, written_size
from .storage.packs import open_store, read_url
from .storage.urls import STORAGE_OPTIONS_ENV, file_url_path, is_url, parse_storage_options, redacted
from .words import counted, in_layer_order, layer_of

LOCK_TIMEOUT = 60.0


class UserError(Exception):
    """A problem with the user's input, said as a :class:`BundleError` is: printed on one line, exit status 2
    (1 for verify)."""


#: How bundles at URLs are reached, set by :func:`main`: fsspec's options and the seconds a store may take to answer.
_storage: dict[str, Any] = {}
_network_timeout = DEFAULT_NETWORK_TIMEOUT


def _shown(name: str) -> str:
    """A path, or a URL without credentials (``redacted``), for messages."""
    return redacted(name) if is_url(name) else name


def _local(name: str) -> Path:
    return Path(file_url_path(name) or name)


def _store(name: str) -> BundleStore:
    """The store of a bundle named by path or URL (credentials and endpoints from the environment)."""
    return open_store(name, LOCK_TIMEOUT, user_cache_dir() / "bundle-copies", _storage, _network_timeout)


def _read(path: str, whole: bool = False) -> Bundle:
    """The bundle at a path or URL (at a URL, ``whole``: every part downloaded now, else each when read)."""
    try:
        if is_url(path):
            return read_url(path, user_cache_dir() / "bundle-copies", _storage, _network_timeout, whole)
        return read_manifest(_local(path))
    except FileNotFoundError:
        raise UserError(f"{_shown(path)}: no such {'object' if is_url(path) else 'file'}") from None


def _say(text: str, stream: TextIO | None = None) -> None:
    """Print one line of output that may hold a manifest's text, escaped so it stays one printable line."""
    print(printable(text), file=stream or sys.stdout)


def _here() -> dict[str, str]:
    try:
        return _torchapi.environment_fingerprint()
    except _torchapi.TorchUnavailable as exc:
        raise UserError(str(exc)) from None


def _binaries(bundle: Bundle, entry: Entry, check: bool = False) -> dict[str, Any]:
    """What an entry carries in compiled binaries, and which builds fit this machine."""
    if entry.binaries_section is None and entry.binaries is None:
        return {}
    carried = bundle.carried_listing(entry)
    problems: list[str] = []
    if check:
        try:
            carried, problems = bundle.carried(entry, check=True)
        except BundleError as exc:
            problems = [str(exc)]
    try:
        identity_here = _torchapi.build_identity()
        here = build_id(identity_here)
        probes = carried.probes(_torchapi.cpu_probe_sources())
    except Exception:  # no compiler or no torch: binaries can still be listed
        here, identity_here, probes = "", {}, set()
    out: dict[str, Any] = {"problems": problems, "builds": []}
    for build, identity in carried.builds.items():
        mine = [f for f in carried.files.values() if f.build == build and is_cpp(f.path)]
        out["builds"].append({"build": build, "identity": identity, "binaries": len(mine), "fits_here": build == here,
                              "bytes": sum(f.size for f in mine), "probes": sum(1 for f in mine if f.path in probes),
                              "differences": "" if build == here or not identity_here
                              else identity_differences(identity, identity_here)})
    return out


def cmd_inspect(args: argparse.Namespace) -> int:
    """The listing, as text or JSON."""
    with _read(args.path) as bundle:
        here = _here()
        items = []
        for i, entry in enumerate(bundle.entries):
            items.append({**entry.describe(), "index": i, "matches_here": entry.env == here,
                          "differences": differences(entry.env, here), "binaries": _binaries(bundle, entry),
                          "signed": bool(entry.signature), "signature": _signature(entry)})
        data = {"path": bundle.name, "format": FORMAT, "entries": items, "bytes": written_size(bundle)}
        if args.json:
            print(json.dumps(data, indent=1, sort_keys=True))
        else:
            _show(bundle, data)
        return 0


def _show(bundle: Bundle, data: dict[str, Any]) -> None:
    """``inspect``'s listing as text."""
    _say(f"{bundle.name}: bundle format {data['format']}, {data['bytes']:,d} bytes on disk (the sizes below unpacked), "
         f"{counted(len(bundle.entries), 'environment')}")
    for item in data["entries"]:
        created, updated = _when(item["created"]), _when(item["updated"])
        match = "matches this machine" if item["matches_here"] else "does NOT match this machine"
        _say(f"[{item['index']}] {env_label(item['env'])}: {match}")
        for key, value in item["env"].items():
            _say(f"    {key:14} {value if value != '' else '(none)'}")
        held = (f"payload {item['size']:,d} bytes" if item.get("stored") is None
                else f"artifacts {item['stored']:,d} bytes stored one by one, table")
        _say(f"    created {created}, updated {updated}, {held}, sha256 {item['sha256'][:16]}...")
        _say(f"    signature      {item['signature']}")
        for kind in in_layer_order(item["artifacts"]):
            counts = item["artifacts"][kind]
            name = layer_of(kind) if layer_of(kind) == kind else f"{layer_of(kind)} ({kind})"
            what = "artifact " if counts["count"] == 1 else "artifacts"
            _say(f"    {name:20} {counts['count']:5d} {what} {counts['bytes']:>12,d} bytes")
        for build in item["binaries"].get("builds", []):
            fits = "fit this machine" if build["fits_here"] else f"do NOT fit this machine ({build['differences']})"
            what = "binary  " if build["binaries"] == 1 else "binaries"
            _say(f"    {'cpp':20} {build['binaries']:5d} {what} {build['bytes']:>13,d} bytes ({_kernels(build)}), "
                 f"built by {build['identity'].get('compiler_version', '?')} for {build['identity'].get('native', '?')}: "
                 f"{fits}")
        for diff in item["differences"]:
            _say(f"    differs: {diff}")


def _when(stamp: float) -> str:
    """A manifest date as local time; one no calendar can show is given as the number it is."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
    except (OverflowError, OSError, ValueError):
        return f"{stamp!r} (not a date)"


def _signature(entry: Entry) -> str:
    """Whether an entry is signed and, with the key in the environment, whether the signature is valid."""
    secret = signing.key()
    if not entry.signature:
        return "none (unsigned)"
    if secret is None:
        return f"signed; not checked ({signing.KEY_ENV} is not set)"
    why = signing.check(entry.describe(), entry.binaries_section, entry.signature, secret)
    return f"signed; {why}" if why else f"signed; valid for {signing.KEY_ENV}"


def _entry_problems(bundle: Bundle, entry: Entry) -> list[str]:
    """What makes an entry unusable, short of its carried binaries: its signature (with the key set), its
    payload's checksum, an artifact key that would leave the cache folder torch writes to."""
    secret = signing.key()
    problems = [bundle.signature_problem(entry, secret)] if secret else []
    try:
        _torchapi.check_keys(bundle.payload(entry))
    except BundleError as exc:
        problems.append(str(exc))
    except _torchapi.MegaCacheError as exc:
        problems.append(f"{bundle.name}: the entry for {env_label(entry.env)}: {exc}")
    except _torchapi.TorchUnavailable as exc:
        raise UserError(str(exc)) from None
    return [p for p in problems if p]


def cmd_verify(args: argparse.Namespace) -> int:
    with _read(args.path) as bundle:
        here = _here()
        entry = bundle.find(here)
        if entry is None:
            raise UserError(bundle.mismatch(here))
        binaries = _binaries(bundle, entry, check=True)
        problems = [*_entry_problems(bundle, entry), *binaries.get("problems", [])]
        if problems:
            raise UserError(problems[0])
        fits = [b for b in binaries.get("builds", []) if b["fits_here"]]
        fit = sum(b["binaries"] for b in fits)
        total = sum(b["binaries"] for b in binaries.get("builds", []))
        parts = _kernels({"binaries": fit, "probes": sum(b.get("probes", 0) for b in fits)})
        carried = f"; {fit} of {total} carried C++ binaries fit this machine ({parts})" if total else ""
        _say(f"{bundle.name}: OK: intact entry for {env_label(entry.env)}{carried}")
        return 0


def _kernels(build: dict[str, Any]) -> str:
    """A build's binaries in both parts, as the session's summary names them: the tests' kernels and torch's CPU probes."""
    kernels, probes = build["binaries"] - build.get("probes", 0), build.get("probes", 0)
    return f"{kernels} kernel{'s' if kernels != 1 else ''}, {probes} CPU probe{'s' if probes != 1 else ''}"


def _update(name: str, change: Any) -> Bundle | None:
    """Read-modify-write the bundle at a path (under its lock) or URL (one pack replacing those read, and the
    packs it could not read: each said as a warning)."""
    said: list[str] | None = [] if is_url(name) else None
    written = _store(name).update(change, dropped=said)
    for warning in said or []:
        _say(f"{_shown(name)}: warning: {warning}", sys.stderr)
    return written


def cmd_merge(args: argparse.Namespace) -> int:
    out = args.output
    if not args.inputs:
        raise UserError("merge needs bundles to merge")
    others = [name for name in args.inputs if not _same_file(name, out)]
    entries = []
    for name in others:
        with _read(name, whole=True) as bundle:
            entries += merge_input(bundle)
    reads_output = len(others) < len(args.inputs)
    inputs = ", ".join(map(_shown, args.inputs))

    def change(current: Bundle | None) -> list[Entry]:
        if reads_output and current is None:
            raise UserError(f"{_shown(out)}: no such file")
        return merged([*(current.entries if reads_output and current else []), *entries], inputs, _shown(out))

    try:
        if is_url(out) and not reads_output:  # a push: one pack of what the URL lacks, nothing read but its tables
            pushed = merged(entries, inputs, _shown(out))
            _store(out).add(pushed).bundle.release()
            _say(f"{_shown(out)}: {counted(len(pushed), 'environment')} from {counted(len(others), 'bundle')} added")
            return 0
        result = _update(out, change)
    except (_torchapi.MegaCacheError, _torchapi.TorchUnavailable) as exc:
        raise UserError(str(exc)) from None
    assert result is not None
    result.release()
    _say(f"{_shown(out)}: {counted(len(result.entries), 'environment')} from "
         f"{counted(len(others) + reads_output, 'bundle')}")
    return 0


def _same_file(a: str, b: str) -> bool:
    if is_url(a) or is_url(b):
        return a == b
    try:
        return _local(a).resolve() == _local(b).resolve()
    except OSError:
        return False


def parse_size(text: str) -> int:
    """``5MB``, ``500k``, ``1.5G`` or a number of bytes, as bytes (k, M, G are powers of 1000; KiB, MiB, GiB of 1024)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgG]?)(i?)[bB]?\s*", text)
    if not match:
        raise UserError(f"--max-size {text!r}: give a size such as 50MB, 500k or 2GiB")
    base = 1024 if match.group(3) else 1000
    return int(float(match.group(1)) * base ** " kmg".index(match.group(2).lower() or " "))


def cmd_prune(args: argparse.Namespace) -> int:
    if not args.keep_matching and not args.drop and args.max_size is None and args.max_unused_runs <= 0:
        raise UserError("prune needs --keep-matching, --drop ENTRY, --max-unused-runs N or --max-size SIZE")
    limit = parse_size(args.max_size) if args.max_size is not None else None
    for spec in args.drop:
        if not spec.isdigit() and "=" not in spec:
            raise UserError(f"--drop {spec!r}: give an entry number (see inspect) or FIELD=VALUE, e.g. device=cpu")
    _read(args.path).close()
    here = _here() if args.keep_matching else None
    shown = _shown(args.path)
    counts = [0, 0]
    said: list[str] = []

    def change(current: Bundle | None) -> list[Entry]:
        if current is None:
            raise UserError(f"{shown}: no such file")
        try:
            kept, said[:] = prune(current, shown, args.drop, here, args.max_unused_runs, limit)
        except (_torchapi.MegaCacheError, _torchapi.TorchUnavailable) as exc:
            raise UserError(f"{shown}: {exc}") from None
        counts[:] = [len(kept), len(current.entries)]
        return kept

    written = _update(args.path, change)
    if written is not None:
        written.release()
    _say(f"{shown}: kept {counts[0]} of {counted(counts[1], 'environment')}" + "".join(f"; {line}" for line in said))
    return 0


DESCRIPTION = ("Inspect, verify, merge and prune pytest-compilecache bundles, at a path or a URL "
               "(also run as: python -m pytest_compilecache).")
EPILOG = ("Exit status: 0 on success; 1 when verify finds the bundle unusable or cannot read it; 2 for any other "
          "error (a command that fails leaves the bundle as it was).")
BUNDLE = "the bundle: a file path or a URL (s3://, gs://, az://; http(s):// to read)"


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: arguments it does not know are its error, shown with its own usage; an
    option is never taken from a prefix of its name (``--max-siz`` is a typo, not ``--max-size``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def parser() -> argparse.ArgumentParser:
    """The command line. Every help text is plain text (argparse prints it as it is)."""
    p = argparse.ArgumentParser(prog="pytest-compilecache", description=DESCRIPTION, epilog=EPILOG, allow_abbrev=False)
    p.add_argument("--version", action="version", version=f"%(prog)s {metadata.version('pytest-compilecache')}",
                   help="print the installed version and exit")
    p.add_argument("--storage-options", metavar="JSON",
                   help=f"fsspec options for bundle URLs, a JSON object such as "
                        f'\'{{"endpoint_url": "http://127.0.0.1:9000"}}\' (default: ${STORAGE_OPTIONS_ENV})')
    p.add_argument("--network-timeout", metavar="SECONDS", type=float, default=DEFAULT_NETWORK_TIMEOUT,
                   help=f"seconds a store may take to answer a request, plus the time a transfer takes at "
                        f"{MIN_RATE // 1000} kB/s; then the command gives up (default {DEFAULT_NETWORK_TIMEOUT:g})")
    sub = p.add_subparsers(dest="command", required=True, metavar="{inspect,verify,merge,prune}", parser_class=_CommandParser,
                           help="what to do: pytest-compilecache COMMAND --help tells more of each")
    inspect = sub.add_parser(
        "inspect", help="show a bundle's entries (one per environment), their artifacts and carried binaries",
        description="Show a bundle's entries (one per environment): their fields, artifacts, carried C++ binaries, "
                    "signature, and whether each matches this machine.", epilog=EPILOG)
    inspect.add_argument("path", help=BUNDLE)
    inspect.add_argument("--json", action="store_true", help="print the listing as JSON")
    inspect.set_defaults(run=cmd_inspect)
    verify = sub.add_parser(
        "verify", help="exit 0 if the bundle holds an intact entry for this machine, else 1 (a CI gate)",
        description="Exit 0 if the bundle holds an entry for this machine whose payload, artifact keys, carried "
                    "binaries (and signature, where PYTEST_COMPILE_CACHE_KEY is set) are intact; else print why "
                    "and exit 1.", epilog=EPILOG)
    verify.add_argument("path", help=BUNDLE)
    verify.set_defaults(run=cmd_verify)
    merge = sub.add_parser(
        "merge", help="write the union of bundles, per environment, to OUTPUT",
        description="Write to OUTPUT the union of the input bundles: one entry per environment holding every "
                    "artifact and carried binary of that environment's entries.", epilog=EPILOG)
    merge.add_argument("inputs", nargs="*", metavar="INPUT",
                       help="a bundle to merge (a path or a URL); name OUTPUT among them to add to it")
    merge.add_argument("-o", "--output", required=True, metavar="OUTPUT",
                       help="the bundle to write (a path or a URL), under its lock; it is replaced unless it is "
                            "also an input, or a URL)")
    merge.set_defaults(run=cmd_merge)
    prune = sub.add_parser(
        "prune", help="make a bundle smaller: drop entries, or its least recently used artifacts",
        description="Make a bundle smaller, in place: drop whole entries (--keep-matching, --drop), then, with "
                    "--max-size, the least recently used artifacts and carried binaries of the entries left. "
                    "A --drop that matches no entry is an error and nothing is changed.", epilog=EPILOG)
    prune.add_argument("path", help=BUNDLE)
    prune.add_argument("--keep-matching", action="store_true", help="drop every entry except this machine's")
    prune.add_argument("--drop", action="append", default=[], metavar="ENTRY",
                       help="drop entry number N (as inspect numbers them) or every entry whose FIELD is VALUE "
                            "(FIELD=VALUE, e.g. device=cpu); repeatable; each must match an entry")
    prune.add_argument("--max-unused-runs", metavar="N", type=int, default=0,
                       help="drop the artifacts and C++ kernels none of the last N updating runs that ran the whole "
                            "suite used (as compile_cache_max_unused_runs does for a bundle file; for a bundle at a "
                            "URL, sessions leave this to prune)")
    prune.add_argument("--max-size", metavar="SIZE",
                       help="then, until the bundle takes at most SIZE (e.g. 50MB, 2GiB), drop its least "
                            "recently used artifacts, then carried C++ binaries (the binaries before the artifacts "
                            "where dropping artifacts alone would leave an entry only its binaries); an entry left "
                            "with no artifact is dropped, and a bundle that cannot keep any artifact is left unchanged")
    prune.set_defaults(run=cmd_prune)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; user errors are one line on stderr and a non-zero exit, never a traceback."""
    global _storage, _network_timeout
    args = parser().parse_args(argv)
    # torch warns at import where numpy is missing (a CPU torch installs none); nothing here uses it.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    try:
        text = args.storage_options if args.storage_options is not None else os.environ.get(STORAGE_OPTIONS_ENV, "")
        if not 0 < args.network_timeout < float("inf"):
            raise UserError(f"--network-timeout must be a number of seconds above 0, not {args.network_timeout:g}")
        _network_timeout = args.network_timeout
        try:
            _storage = parse_storage_options(text)
        except ValueError as exc:
            where = "--storage-options" if args.storage_options is not None else STORAGE_OPTIONS_ENV
            raise UserError(f"{where} {exc}") from None
        return int(args.run(args))
    except (UserError, BundleError) as exc:
        _say(f"pytest-compilecache {args.command}: error: {exc}", sys.stderr)
        return 1 if args.command == "verify" else 2


def _entry() -> Any:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left (``| head``): stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    sys.exit(code)
