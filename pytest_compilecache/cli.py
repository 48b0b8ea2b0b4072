"""``pytest-compilecache`` / ``python -m pytest_compilecache``: inspect, verify, merge and prune bundles."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from . import _torchapi
from .bundle import Bundle, BundleError, Entry, differences, env_label, make_entry, read_manifest, write_bundle
from .sharing import acquire, lock_for

LOCK_TIMEOUT = 60.0


class UserError(Exception):
    """A problem with the user's input: printed on one line, exit status 2 (1 for verify)."""


def _read(path: str) -> Bundle:
    try:
        return read_manifest(Path(path))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except BundleError as exc:
        raise UserError(str(exc)) from None


def _here() -> dict[str, str]:
    try:
        return _torchapi.environment_fingerprint()
    except _torchapi.TorchUnavailable as exc:
        raise UserError(str(exc)) from None


def cmd_inspect(args: argparse.Namespace) -> int:
    bundle = _read(args.path)
    here = _here()
    if args.check:
        for entry in bundle.entries:
            try:
                bundle.payload(entry)
            except BundleError as exc:
                raise UserError(str(exc)) from None
    data: dict[str, Any] = {
        "path": str(bundle.path),
        "format": 1,
        "bytes": bundle.path.stat().st_size,
        "entries": [
            {**entry.describe(), "index": i, "matches_here": entry.env == here,
             "differences": differences(entry.env, here)}
            for i, entry in enumerate(bundle.entries)
        ],
    }
    if args.json:
        print(json.dumps(data, indent=1, sort_keys=True))
        return 0
    print(f"{bundle.path}: bundle format 1, {data['bytes'] / 1e6:.2f} MB, {len(bundle.entries)} environment(s)")
    for item in data["entries"]:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(item["created"]))
        updated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(item["updated"]))
        match = "matches this machine" if item["matches_here"] else "does NOT match this machine"
        print(f"[{item['index']}] {env_label(item['env'])}: {match}")
        for key, value in item["env"].items():
            print(f"    {key:14} {value}")
        print(f"    created {created}, updated {updated}, payload {item['size']} bytes, sha256 {item['sha256'][:16]}...")
        for kind, counts in sorted(item["artifacts"].items()):
            print(f"    {kind:14} {counts['count']:5d} artifacts {counts['bytes']:>12,d} bytes")
        for diff in item["differences"]:
            print(f"    differs: {diff}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    bundle = _read(args.path)
    here = _here()
    entry = bundle.find(here)
    if entry is None:
        raise UserError(bundle.mismatch(here))
    try:
        bundle.payload(entry)
    except BundleError as exc:
        raise UserError(str(exc)) from None
    print(f"{bundle.path}: OK: intact entry for {env_label(entry.env)}")
    return 0


def _write(out: Path, entries: list[Entry]) -> None:
    lock = lock_for(out, LOCK_TIMEOUT)
    try:
        acquire(lock, LOCK_TIMEOUT)
        try:
            write_bundle(Bundle(out, entries))
        finally:
            lock.release()
    except BundleError as exc:
        raise UserError(str(exc)) from None


def cmd_merge(args: argparse.Namespace) -> int:
    bundles = [_read(p) for p in args.inputs]
    groups: dict[str, list[Entry]] = {}
    for bundle in bundles:
        for entry in bundle.entries:
            try:
                bundle.payload(entry)
            except BundleError as exc:
                raise UserError(str(exc)) from None
            groups.setdefault(json.dumps(entry.env, sort_keys=True), []).append(entry)
    entries = []
    for group in groups.values():
        first = group[0]
        payloads = list(dict.fromkeys(e.payload for e in group if e.payload is not None))
        if len(payloads) == 1:
            entries.append(first)
            continue
        try:
            payload = _torchapi.merge_artifacts(payloads)
            artifacts = _torchapi.describe_artifacts(payload)
        except (_torchapi.MegaCacheError, _torchapi.TorchUnavailable) as exc:
            raise UserError(f"cannot merge the entries for {env_label(first.env)}: {exc}") from None
        merged = make_entry(first.env, payload, artifacts, min(e.created for e in group))
        merged.history = first.history
        entries.append(merged)
    _write(Path(args.output), entries)
    print(f"{args.output}: {len(entries)} environment(s) from {len(bundles)} bundle(s)")
    return 0


def _dropped(spec: str, index: int, entry: Entry) -> bool:
    if spec.isdigit():
        return int(spec) == index
    key, sep, value = spec.partition("=")
    if not sep:
        raise UserError(f"--drop {spec!r}: give an entry number (see inspect) or FIELD=VALUE, e.g. device=cpu")
    return entry.env.get(key) == value


def cmd_prune(args: argparse.Namespace) -> int:
    bundle = _read(args.path)
    if not args.keep_matching and not args.drop:
        raise UserError("prune needs --keep-matching or --drop ENV")
    here = _here() if args.keep_matching else None
    kept = []
    for i, entry in enumerate(bundle.entries):
        if here is not None and entry.env != here:
            continue
        if any(_dropped(spec, i, entry) for spec in args.drop):
            continue
        kept.append(entry)
    _write(bundle.path, kept)
    print(f"{bundle.path}: kept {len(kept)} of {len(bundle.entries)} environment(s)")
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="pytest-compilecache", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    inspect = sub.add_parser("inspect", help="show a bundle's environments and artifacts")
    inspect.add_argument("path")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.add_argument("--check", action="store_true", help="also verify every payload's checksum")
    inspect.set_defaults(run=cmd_inspect)
    verify = sub.add_parser("verify", help="exit 0 if intact and matching this machine")
    verify.add_argument("path")
    verify.set_defaults(run=cmd_verify)
    merge = sub.add_parser("merge", help="union of bundles, per environment")
    merge.add_argument("inputs", nargs="+")
    merge.add_argument("-o", "--output", required=True)
    merge.set_defaults(run=cmd_merge)
    prune = sub.add_parser("prune", help="remove environments")
    prune.add_argument("path")
    prune.add_argument("--keep-matching", action="store_true", help="keep only this machine's entry")
    prune.add_argument("--drop", action="append", default=[], metavar="ENV",
                       help="drop entry number N (from inspect) or entries with FIELD=VALUE; repeatable")
    prune.set_defaults(run=cmd_prune)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; user errors are one line on stderr and a non-zero exit, never a traceback."""
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except UserError as exc:
        print(f"pytest-compilecache {args.command}: error: {exc}", file=sys.stderr)
        return 1 if args.command == "verify" else 2
    except BundleError as exc:
        print(f"pytest-compilecache {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _entry() -> Any:
    sys.exit(main())
