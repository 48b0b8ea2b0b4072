"""Seeded fuzzing of bundles through the plugin's reader, its loader and every CLI command.

Starts from real bundles (made by a real ``torch.compile`` run, then signed, and paired with a second
entry), mutates them (bit flips, truncations, extensions, swapped entries, crafted manifests, hostile
artifact keys, bad signatures, hostile carried binaries), and runs each case through
``read_manifest``/``read_all``/``signature_problem``/``carried``, through
``BundlePreparation.load_or_warm_up`` with torch's ``load_cache_artifacts`` instrumented, and through every
CLI command in process, each with and without ``PYTEST_COMPILE_CACHE_KEY``. Exits 1 on any violated invariant, printing how to replay it.

    python scripts/fuzz_bundles.py --seed 1 --count 10000
    python scripts/fuzz_bundles.py --seed 1 --only 4711 -v      # replay one case
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

from pytest_compilecache import _torchapi, cli
from pytest_compilecache._torchapi import layout as torch_layout
from pytest_compilecache.bundle import signing
from pytest_compilecache.session.pool import BinaryPool
from pytest_compilecache.bundle.format import Bundle, BundleError, make_entry, read_manifest
from pytest_compilecache.bundle.writing import write_bundle
from pytest_compilecache.bundle.members import WHOLE, Members, unpack_table
from pytest_compilecache.storage.local import LocalStore
from pytest_compilecache.session.options import Options
from pytest_compilecache.session.preparation import BundlePreparation
from pytest_compilecache.channel import BundleAtStart

KEY = "fuzz-signing-key"
OTHER_KEY = "some-other-key"
ESCAPE = "fuzzescape"
CASE_SECONDS = 20
FOREIGN_DEVICE = "NVIDIA H200"


class Hang(BaseException):
    """A case ran past its time limit."""


# ---------------------------------------------------------------- real bundles


def build_real_bundle(folder: Path, env: dict[str, str] | None = None, headers: Path | None = None) -> Path:
    """A real bundle for this machine: a pytest run that compiles two small functions (as tests/test_cli.py).

    The run's plugin home is ``folder/home`` (never the user's cache folder), its precompiled headers
    there too unless ``headers`` names a folder for them. ``env``: variables to set for that run (over
    this process's environment, without the signing key)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_make.py").write_text(
        "import torch\n\ndef test_make():\n"
        "    torch.compile(lambda x: x.sin() + 1)(torch.randn(8))\n"
        "    torch.compile(lambda x: x.cos() * 2)(torch.randn(8))\n"
    )
    bundle = folder / "good.bundle"
    run_env = {**{k: v for k, v in os.environ.items() if k != signing.KEY_ENV}, **(env or {})}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-o", f"compile_cache_home={folder / 'home'}",
         *(["-o", f"compile_cache_headers_dir={headers}"] if headers is not None else []),
         f"--compile-cache-bundle={bundle}", f"--basetemp={folder / 'base'}"],
        cwd=folder, check=True, capture_output=True, timeout=600, env=run_env,
    )
    return bundle


def _deserialize(payload: bytes) -> dict[str, list[Any]]:
    from torch.compiler._cache import CacheArtifactManager

    getattr(CacheArtifactManager, "_ensure_cache_artifacts_registered", lambda: None)()
    return dict(CacheArtifactManager.deserialize(payload))


def serialize(artifacts: dict[str, list[Any]]) -> bytes:
    """Mega-Cache bytes holding ``artifacts`` (``{type: [artifact, ...]}``)."""
    from torch.compiler._cache import _serialize_single_cache
    from torch.utils._appending_byte_serializer import AppendingByteSerializer

    serializer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    serializer.extend((k, list(v)) for k, v in artifacts.items() if v)
    return bytes(serializer.to_bytes())


@contextlib.contextmanager
def key_set(secret: str | None) -> Iterator[None]:
    """``PYTEST_COMPILE_CACHE_KEY`` set to ``secret`` (unset for None) inside the block."""
    old = os.environ.pop(signing.KEY_ENV, None)
    if secret is not None:
        os.environ[signing.KEY_ENV] = secret
    try:
        yield
    finally:
        os.environ.pop(signing.KEY_ENV, None)
        if old is not None:
            os.environ[signing.KEY_ENV] = old


@dataclasses.dataclass
class Seeds:
    """The real bundles mutations start from, and what an intact one holds."""

    bundles: dict[str, bytes]
    payloads: list[bytes]
    signed_payloads: set[bytes]
    signed_binaries: set[str]
    #: The sha256 of every artifact of the signed payloads.
    signed_artifacts: set[str] = dataclasses.field(default_factory=set)

    @classmethod
    def from_real(cls, real: Path, folder: Path) -> "Seeds":
        """``plain`` (the real run's bundle, carrying C++ binaries), ``pair`` (it plus a foreign entry
        holding part of its artifacts) and ``signed`` (``pair`` written with the key set)."""
        folder.mkdir(parents=True, exist_ok=True)
        with read_manifest(real) as bundle:
            bundle.read_all()
        read = bundle.entries[0]
        assert read.binaries, f"{real}: the real run carried no binaries"
        entry = make_entry(read.env, bundle.payload(read), read.artifacts, read.created, read.binaries)
        entry.history = read.history
        part = {kind: items[:1] for kind, items in _deserialize(entry.payload).items()}
        sub = serialize(part)
        foreign = make_entry({**entry.env, "device": FOREIGN_DEVICE}, sub, _torchapi.describe_artifacts(sub),
                             entry.created)
        foreign.history = {"warmup_seconds": 1.5, "tests": {"test_x.py::test_y": 0.25}}
        with key_set(None):
            write_bundle(Bundle(folder / "pair.bundle", [entry, foreign]))
        with key_set(KEY):
            write_bundle(Bundle(folder / "signed.bundle", [entry, foreign]))
        bundles = {"plain": real.read_bytes(), "pair": (folder / "pair.bundle").read_bytes(),
                   "signed": (folder / "signed.bundle").read_bytes()}
        with read_manifest(folder / "signed.bundle") as signed:
            signed.read_all()
            shas = {f.sha256 for e in signed.entries for f in signed.carried(e)[0].files.values()}
        assert all(e.signature for e in signed.entries)
        artifacts = {hashlib.sha256(c).hexdigest() for p in (bundle.payload(read), sub) for *_, c in contents(p)}
        return cls(bundles, [bundle.payload(read), sub], {bundle.payload(read), sub}, shas, artifacts)


# ---------------------------------------------------------------- bundle bytes, leniently


def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    """An intact bundle's manifest and the bytes after it."""
    _, length, rest = data.split(b"\n", 2)
    return json.loads(rest[:int(length)]), rest[int(length):]


RAW = re.compile(r'"@@RAW:(.*?)@@"')


def dumps(manifest: Any) -> bytes:
    """JSON text of ``manifest``; a string ``@@RAW:token@@`` becomes the bare token (``NaN``, ``1e999``, ...)."""
    text = json.dumps(manifest, indent=1)
    return RAW.sub(lambda m: m.group(1), text).encode("utf-8", "surrogatepass")


def join(manifest_text: bytes, body: bytes, length: bytes | None = None) -> bytes:
    line = b"%d\n" % len(manifest_text) if length is None else length
    return b"PYTEST-COMPILECACHE-BUNDLE\n" + line + manifest_text + body


def contents(payload: bytes) -> list[tuple[str, str, bytes]]:
    """A payload's artifacts as format 2 stores them: taken apart by torch, else one whole member."""
    try:
        return _torchapi.artifact_contents(payload)
    except _torchapi.MegaCacheError:
        return [(WHOLE, "", payload)]


def packed(payload: bytes) -> tuple[bytes, bytes]:
    """The table and the members' bytes format 2 stores ``payload`` as."""
    members = Members.packed(contents(payload))
    return members.table_blob(), b"".join(members.raw(m) for m in members.table)


def unpacked(table: bytes, region: bytes) -> bytes:
    """The payload an intact format-2 entry's table and members hold."""
    members = Members(unpack_table(table), lambda at, size: region[at:at + size])
    listed = list(members.contents())
    return listed[0][2] if listed[0][0] == WHOLE else _torchapi.artifacts_bytes(listed)


def stated(data: bytes) -> tuple[set[str], set[str]]:
    """The artifact and carried-file checksums a (possibly mutated) bundle states: an entry's (format 1), or
    its table's rows where the table matches the checksum the manifest states for it (format 2)."""
    try:
        manifest, body = split(data)
        entries = manifest["entries"]
    except Exception:
        return set(), set()
    payloads, files = set(), set()
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict):
            if isinstance(e.get("sha256"), str):
                payloads.add(e["sha256"])
                with contextlib.suppress(Exception):
                    table = body[e["offset"]:e["offset"] + e["size"]]
                    if hashlib.sha256(table).hexdigest() == e["sha256"]:
                        payloads.update(m.sha256 for m in unpack_table(table))
            section = e.get("binaries")
            if isinstance(section, dict) and isinstance(section.get("files"), list):
                files.update(str(f[2]) for f in section["files"] if isinstance(f, list) and len(f) > 2)
    return payloads, files


@dataclasses.dataclass
class Parts:
    """A bundle taken apart: manifest, and each entry's payload and binaries blob."""

    manifest: dict[str, Any]
    payloads: list[bytes]
    blobs: list[bytes | None]

    @classmethod
    def of(cls, data: bytes) -> "Parts":
        manifest, body = split(data)
        payloads, blobs = [], []
        for e in manifest["entries"]:
            start, end = e["offset"] + e["size"], e["offset"] + e["size"] + e.get("stored", 0)
            payloads.append(unpacked(body[e["offset"]:start], body[start:end]) if "stored" in e
                            else body[e["offset"]:start])
            b = e.get("binaries")
            blobs.append(body[b["offset"]:b["offset"] + b["size"]] if b else None)
        return cls(manifest, payloads, blobs)

    @property
    def entries(self) -> list[dict[str, Any]]:
        return list(self.manifest["entries"])

    def set_payload(self, i: int, data: bytes) -> None:
        """Replace entry ``i``'s payload (stored as format 2 stores it, with a table whose checksum matches)."""
        self.payloads[i] = data

    def set_blob(self, i: int, blob: bytes) -> None:
        self.blobs[i] = blob
        self.manifest["entries"][i]["binaries"].update(size=len(blob), sha256=hashlib.sha256(blob).hexdigest())

    def layout(self) -> bytes:
        """The body, with every entry's offsets set to where its blobs now lie."""
        body, at = [], 0
        for e, payload, blob in zip(self.manifest["entries"], self.payloads, self.blobs):
            table, region = packed(payload)
            e.update(offset=at, size=len(table), stored=len(region), sha256=hashlib.sha256(table).hexdigest())
            body += [table, region]
            at += len(table) + len(region)
            if blob is not None and isinstance(e.get("binaries"), dict):
                e["binaries"]["offset"] = at
                body.append(blob)
                at += len(blob)
        return b"".join(body)

    def build(self, change: Callable[[dict[str, Any]], None] | None = None) -> bytes:
        """The bundle's bytes: blobs laid out, then ``change`` applied to the manifest."""
        body = self.layout()
        if change is not None:
            change(self.manifest)
        return join(dumps(self.manifest), body)

    def sign(self, i: int, secret: str) -> None:
        e = self.manifest["entries"][i]
        described = {k: e[k] for k in ("history", "env", "created", "updated", "size", "sha256", "artifacts", "stored")}
        e["signature"] = signing.sign(described, e.get("binaries"), secret.encode())


# ---------------------------------------------------------------- hostile values

NAN, INF = float("nan"), float("inf")
RAW_NUMBERS = ["@@RAW:NaN@@", "@@RAW:Infinity@@", "@@RAW:-Infinity@@", "@@RAW:1e999@@", "@@RAW:-1e999@@",
               "@@RAW:" + "9" * 5000 + "@@", "@@RAW:-" + "9" * 4299 + "@@", "@@RAW:1" + "0" * 400 + "@@",
               "@@RAW:1e-999@@", "@@RAW:-0@@", "@@RAW:1.0@@", "@@RAW:0.5@@"]
NUMBERS: list[Any] = [0, -1, 1, -2 ** 31, 2 ** 31, 2 ** 53 + 1, 2 ** 63, -2 ** 63, 2 ** 64 + 7, 10 ** 30, 1e308, -1e308,
                      5e-324, -0.0, 1.5, 253402300800.0, -62135596801.0, 1e17, *RAW_NUMBERS]


def hostile_strings(rng: random.Random) -> list[Any]:
    return ["", "x", "../../x", "/abs/x", "\x00", "a\x00b", "\ud800", "\udcff\ud800x", "line\nbreak", "\r\n",
            "\x1b[31mred\x1b[0m", "\u202eevil", "A" * rng.choice([300, 5000, 200_000]), "é" * 50, "\\..\\..\\x",
            "0" * 64, "f" * 64, "g" * 64, "NaN", "1e999", "%s%n%x", "{0}"]


def nested(depth: int) -> str:
    """A list nested ``depth`` deep, as a raw JSON token (too deep for ``json.dumps``)."""
    return "@@RAW:" + "[" * depth + "1" + "]" * depth + "@@"


def hostile(rng: random.Random) -> Any:
    """A value of a random hostile kind: wrong type, extreme number, odd string, deep nesting."""
    kind = rng.randrange(8)
    if kind == 0:
        return rng.choice(NUMBERS)
    if kind == 1:
        return rng.choice(hostile_strings(rng))
    if kind == 2:
        return rng.choice([None, True, False])
    if kind == 3:
        return rng.choice([[], [1], [None], ["a", "b", "c", 1, 2], [[[]]], list(range(5))])
    if kind == 4:
        return rng.choice([{}, {"a": 1}, {"count": "1", "bytes": 2}, {"count": 1, "bytes": 1.5}, {"": None},
                           {"offset": -1, "size": 1}])
    if kind == 5:
        return nested(rng.choice([10, 100, 400, 900, 990, 2000, 50_000]))
    if kind == 6:
        return rng.choice([NAN, INF, -INF, "@@RAW:NaN@@", "@@RAW:1e999@@"])
    return rng.choice(NUMBERS + hostile_strings(rng))


def paths(value: Any, prefix: tuple[Any, ...] = (), limit: int = 8) -> list[tuple[Any, ...]]:
    """Every path to a node of a JSON value (not deeper than ``limit``)."""
    found = [prefix]
    if len(prefix) >= limit:
        return found
    if isinstance(value, dict):
        for k, v in value.items():
            found += paths(v, (*prefix, k), limit)
    elif isinstance(value, list):
        for i, v in enumerate(value[:8]):
            found += paths(v, (*prefix, i), limit)
    return found


def at(value: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        value = value[p]
    return value


# ---------------------------------------------------------------- mutations


@dataclasses.dataclass
class Case:
    """One mutated bundle: its class, how it was made, its bytes."""

    index: int
    kind: str
    how: str
    data: bytes


def _base(rng: random.Random, seeds: Seeds, names: tuple[str, ...] = ("plain", "pair", "signed")) -> tuple[str, bytes]:
    name = rng.choice(names)
    return name, seeds.bundles[name]


def _manifest_end(data: bytes) -> int:
    try:
        _, length, _ = data.split(b"\n", 2)
        return len(data.split(b"\n", 1)[0]) + len(length) + 2 + int(length)
    except ValueError:
        return len(data)


def m_bitflip(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    name, data = _base(rng, seeds)
    buf = bytearray(data)
    end = _manifest_end(data)
    flips = rng.choice([1, 1, 2, 4, 8, 64])
    where = rng.choice(["header", "manifest", "anywhere"])
    spots = []
    for _ in range(flips):
        top = 40 if where == "header" else end if where == "manifest" else len(buf)
        pos = rng.randrange(top)
        buf[pos] ^= 1 << rng.randrange(8)
        spots.append(pos)
    return f"{name}: {flips} bit(s) flipped in {where} at {spots[:8]}", bytes(buf)


def m_truncate(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    name, data = _base(rng, seeds)
    end = _manifest_end(data)
    choice = rng.randrange(5)
    cut = [rng.randrange(40), rng.randrange(end), end, rng.randrange(end, len(data)), len(data) - 1][choice]
    return f"{name}: cut to {cut} of {len(data)} bytes", data[:cut]


def m_extend(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    name, data = _base(rng, seeds)
    junk = rng.choice([b"\x00" * rng.randrange(1, 5000), rng.randbytes(rng.randrange(1, 5000)),
                       seeds.bundles["plain"], b"\n" * 10, seeds.payloads[0][:1000]])
    if rng.random() < 0.5:
        return f"{name}: {len(junk)} junk bytes appended", data + junk
    pos = rng.randrange(len(data))
    return f"{name}: {len(junk)} junk bytes inserted at {pos}", data[:pos] + junk + data[pos:]


def m_swap(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    name, data = _base(rng, seeds, ("pair", "signed"))
    parts = Parts.of(data)
    manifest, body = split(data)
    e0, e1 = manifest["entries"]
    choice = rng.randrange(8)
    if choice == 0:
        e0["env"], e1["env"] = e1["env"], e0["env"]
        return f"{name}: environments of the two entries swapped", join(dumps(manifest), body)
    if choice == 1:
        for k in ("offset", "size", "sha256"):
            e0[k], e1[k] = e1[k], e0[k]
        return f"{name}: payload places of the two entries swapped", join(dumps(manifest), body)
    if choice == 2:
        parts.payloads.reverse()
        layout = parts.layout()
        return f"{name}: payload bytes swapped, manifest kept", join(dumps(manifest), layout)
    if choice == 3:
        manifest["entries"] = [e0, dict(e0)] if rng.random() < 0.5 else [e1, e0, e1, e0]
        return f"{name}: entries duplicated", join(dumps(manifest), body)
    if choice == 4:
        parts.payloads[1] = parts.payloads[0]
        parts.manifest["entries"][1].update(size=e0["size"], sha256=e0["sha256"])
        parts.manifest["entries"][1]["env"] = dict(e0["env"])
        return f"{name}: second entry with this machine's env and the first's payload", parts.build()
    if choice == 5:
        e1["env"] = dict(e0["env"])
        return f"{name}: two entries for this machine, different payloads", join(dumps(manifest), body)
    if choice == 6:
        e0["binaries"], e1["binaries"] = e1.get("binaries"), e0.get("binaries")
        if e0["binaries"] is None:
            del e0["binaries"]
        if "signature" in e1:
            e0["signature"], e1["signature"] = e1["signature"], e0["signature"]
        return f"{name}: binaries sections (and signatures) moved between entries", join(dumps(manifest), body)
    manifest["entries"] = list(reversed(manifest["entries"]))
    return f"{name}: entries in reverse order", join(dumps(manifest), body)


def m_offsets(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    name, data = _base(rng, seeds)
    manifest, body = split(data)
    entries = manifest["entries"]
    e = rng.choice(entries)
    section = e.get("binaries") if rng.random() < 0.4 else None
    target = section if section is not None else e
    field = rng.choice(["offset", "size"])
    value = rng.choice([-1, -2 ** 63, 2 ** 63, 2 ** 64, 10 ** 30, len(body), len(body) + 1, 0, 1,
                        target[field] + rng.randint(-100, 100), rng.randrange(len(body))])
    if rng.random() < 0.3 and field == "offset":
        other = rng.choice(entries)
        value = other["offset"] + rng.randrange(max(1, other["size"]))
    if rng.random() < 0.2 and section is not None:
        files = section["files"]
        i = rng.randrange(len(files))
        j = rng.randrange(len(files))
        delta = rng.randint(1, 50)
        files[i][4] += delta
        files[j][4] -= delta
        return f"{name}: carried files' stored sizes shifted by {delta} ({i}->{j}), total kept", join(dumps(manifest), body)
    target[field] = value
    where = "binaries." if section is not None else ""
    return f"{name}: {where}{field} = {value}", join(dumps(manifest), body)


def m_types(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    name, data = _base(rng, seeds)
    manifest, body = split(data)
    candidates = paths(manifest)
    path = rng.choice(candidates[1:])
    parent, last = at(manifest, path[:-1]), path[-1]
    action = rng.randrange(10)
    value = hostile(rng)
    if action == 0 and isinstance(parent, dict):
        del parent[last]
        how = "removed"
    elif action == 1 and isinstance(parent, dict):
        parent[str(rng.choice(hostile_strings(rng)))[:40]] = parent.pop(last)
        how = "renamed"
    elif action == 2 and isinstance(parent, dict):
        parent[rng.choice(["extra", "offset", "binaries", "signature", "size", ""])] = value
        how = f"a key added: {_short(value)}"
    else:
        parent[last] = value
        how = f"= {_short(value)}"
    return f"{name}: manifest{''.join(f'[{p!r}]' for p in path)} {how}", join(dumps(manifest), body)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


def m_numbers(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    name, data = _base(rng, seeds)
    manifest, body = split(data)
    e = rng.choice(manifest["entries"])
    field = rng.choice(["created", "updated", "size", "offset", "created", "updated", "artifacts", "binaries", "history"])
    value = rng.choice(NUMBERS + [NAN, INF, -INF])
    if field == "artifacts":
        kind = rng.choice(list(e["artifacts"]))
        e["artifacts"][kind][rng.choice(["count", "bytes"])] = value
    elif field == "binaries" and e.get("binaries"):
        sub = rng.choice(["offset", "size", "files"])
        if sub == "files":
            e["binaries"]["files"][0][rng.choice([3, 4])] = value
        else:
            e["binaries"][sub] = value
    elif field == "history":
        e["history"][rng.choice(["warmup_seconds", "tests"])] = value
    else:
        e[field] = value
    return f"{name}: {field} = {_short(value)}", join(dumps(manifest), body)


def m_length(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    name, data = _base(rng, seeds)
    _, length, rest = data.split(b"\n", 2)
    n = int(length)
    line = rng.choice([b"\n", b"-5\n", b"+%d\n" % n, b" %d\n" % n, b"%d \n" % n, b"0x10\n", b"%d\n" % (n + 1),
                       b"%d\n" % (n - 1), b"0\n", b"%d\n" % 10 ** 30, b"9" * 31 + b"\n", b"9" * 40 + b"\n",
                       "\u0661\u0662\n".encode(), b"%d\r\n" % n, b"%d" % n, b"%d\n" % 2 ** 64, b"%d\n" % (64 * 2 ** 20 + 1),
                       b"%d\n" % (n * 2), b"\x00%d\n" % n, b"1_000\n", b"%d.0\n" % n, b"%d\n" % (len(rest) + 1)])
    return f"{name}: manifest length line {line!r}", b"PYTEST-COMPILECACHE-BUNDLE\n" + line + rest


def m_structure(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    name, data = _base(rng, seeds)
    manifest, body = split(data)
    text = dumps(manifest)
    choice = rng.randrange(12)
    if choice == 0:
        depth = rng.choice([100, 600, 990, 1000, 5000, 200_000])
        new = b'{"format": 2, "entries": ' + b"[" * depth + b"]" * depth + b"}"
        return f"{name}: entries nested {depth} deep", join(new, body)
    if choice == 1:
        depth = rng.choice([50, 300, 450, 700, 900, 950, 980, 995])
        e = rng.choice(manifest["entries"])
        place = rng.choice(["history", "env", "artifacts", "binaries"])
        if place == "history":
            e["history"]["deep"] = nested(depth)
        elif place == "env":
            e["env"]["deep"] = nested(depth)
        elif place == "artifacts":
            e["artifacts"]["deep"] = nested(depth)
        else:
            e.setdefault("binaries", {})["deep"] = nested(depth)
        return f"{name}: {place} holds a value nested {depth} deep", join(dumps(manifest), body)
    if choice == 2:
        pos = rng.randrange(len(text))
        bad = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])
        return f"{name}: non-UTF-8 {bad!r} at {pos} (length kept)", join(text[:pos] + bad + text[pos + len(bad):], body)
    if choice == 3:
        return f"{name}: UTF-8 BOM before the manifest", join(b"\xef\xbb\xbf" + text, body)
    if choice == 4:
        top = rng.choice([b"[]", b"null", b'"x"', b"1", b"{}", b'{"format": 2}', b'{"entries": []}'])
        return f"{name}: manifest is {top!r}", join(top, body)
    if choice == 5:
        manifest["format"] = rng.choice([0, 1, "2", None, 1.0, True, -1, 2 ** 64, [1], {"v": 1}, NAN,
                                         "@@RAW:" + "9" * 5000 + "@@", "@@RAW:1" + "0" * 4000 + "@@"])
        return f"{name}: format = {_short(manifest['format'])}", join(dumps(manifest), body)
    if choice == 6:
        manifest["entries"] = rng.choice([{}, "entries", None, 1, [None], [[]], ["x"], [1], {"0": manifest["entries"][0]}])
        return f"{name}: entries = {_short(manifest['entries'])}", join(dumps(manifest), body)
    if choice == 7:
        dup = text.replace(b'"entries":', b'"entries": [], "entries":', 1)
        if rng.random() < 0.5:
            dup = text.replace(b'"format": 2', b'"format": 2, "format": 1', 1)
        return f"{name}: a duplicated manifest key", join(dup, body)
    if choice == 8:
        e = manifest["entries"][0]
        manifest["entries"] = [e] * rng.choice([40, 150])
        return f"{name}: {len(manifest['entries'])} entries sharing one payload", join(dumps(manifest), body)
    if choice == 9:
        e = rng.choice(manifest["entries"])
        size = rng.choice([10 ** 5, 10 ** 6])
        e["env"][rng.choice(["torch", "device", "x" * 100])] = "A" * size
        return f"{name}: an env value of {size} characters", join(dumps(manifest), body)
    if choice == 10:
        e = rng.choice(manifest["entries"])
        e["env"] = {k: rng.choice(hostile_strings(rng)) for k in e["env"]}
        return f"{name}: every env value hostile", join(dumps(manifest), body)
    bad = text.replace(b"}", b"", 1) if rng.random() < 0.5 else text + b"trailing"
    return f"{name}: JSON syntax broken", join(bad, body)


HOSTILE_KEYS = ["../../{E}", "../../../../../../../../{E}", "/ABS/{E}", "a\x00b", "", ".", "..", "x" * 10000,
                "f" + "../" * 5 + "{E}", "fa/../../../{E}", "C:\\{E}", "..\\..\\{E}", "\\\\server\\share\\{E}",
                "fab/cd/../../../../{E}", "f" + "a" * 51 + "/../../../{E}", "f" + "a" * 52 + "\n",
                "f" + "a" * 52 + "\x00", "fé" + "a" * 51, "a/b/c/d/e/f", "f" + "A" * 52, "f" + "a" * 600,
                "f" + "a" * 52, "a" + "b" * 52, "{ABS}/{E}"]


def m_keys(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    name, data = _base(rng, seeds)
    parts = Parts.of(data)
    i = rng.randrange(len(parts.payloads))
    artifacts = _deserialize(parts.payloads[i])
    kind = rng.choice(sorted(artifacts))
    j = rng.randrange(len(artifacts[kind]))
    key = rng.choice(HOSTILE_KEYS).replace("{E}", ESCAPE).replace("{ABS}", ctx)
    how = f"{name}: entry {i} {kind}[{j}] key {_short(key)}"
    artifacts[kind][j] = dataclasses.replace(artifacts[kind][j], key=key)
    if rng.random() < 0.2:
        artifacts[kind][j] = dataclasses.replace(artifacts[kind][j], content=rng.randbytes(rng.randrange(100)))
        how += ", content replaced"
    parts.set_payload(i, serialize(artifacts))
    if rng.random() < 0.3:
        parts.layout()
        parts.sign(i, OTHER_KEY)
        how += ", signed with another key"
    return how + ", checksum recomputed", parts.build()


def m_payload(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    name, data = _base(rng, seeds)
    parts = Parts.of(data)
    i = rng.randrange(len(parts.payloads))
    payload = bytearray(parts.payloads[i])
    choice = rng.randrange(6)
    if choice == 0:
        for _ in range(rng.choice([1, 4, 32])):
            payload[rng.randrange(len(payload))] ^= 1 << rng.randrange(8)
        how = "bits flipped"
    elif choice == 1:
        payload = payload[:rng.randrange(len(payload))]
        how = "cut short"
    elif choice == 2:
        payload = bytearray(rng.randbytes(rng.randrange(0, 4000)))
        how = "random bytes"
    elif choice == 3:
        pos = rng.randrange(min(64, len(payload)))
        payload[pos:pos + 8] = rng.choice([b"\xff" * 8, b"\x7f" + b"\xff" * 7, b"\x00" * 8, (2 ** 62).to_bytes(8, "little")])
        how = f"a length field near {pos} made huge or zero"
    elif choice == 4:
        payload = bytearray(b"")
        how = "empty"
    else:
        payload = payload + payload
        how = "doubled"
    parts.set_payload(i, bytes(payload))
    return f"{name}: entry {i} payload {how}, checksum recomputed", parts.build()


def m_signature(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    parts = Parts.of(seeds.bundles["signed"])
    i = rng.randrange(len(parts.payloads))
    e = parts.manifest["entries"][i]
    choice = rng.randrange(12)
    if choice == 0:
        parts.layout()
        parts.sign(i, OTHER_KEY)
        how = "signed with another key"
    elif choice == 1:
        del e["signature"]
        how = "signature removed"
    elif choice == 2:
        e["history"]["tests"] = {"forged": 1.0}
        how = "history changed after signing"
    elif choice == 3:
        e["env"]["device"] = FOREIGN_DEVICE if e["env"]["device"] == "cpu" else "cpu"
        how = "env changed after signing"
    elif choice == 4:
        e["created"] = e["created"] + 1
        how = "created changed after signing"
    elif choice == 5:
        artifacts = _deserialize(parts.payloads[i])
        kind = sorted(artifacts)[0]
        artifacts[kind][0] = dataclasses.replace(artifacts[kind][0], content=b"forged content")
        parts.set_payload(i, serialize(artifacts))
        how = "payload replaced after signing, checksum recomputed"
    elif choice == 6:
        parts.set_payload(i, parts.payloads[1 - i])
        how = "the other entry's payload put in, checksum recomputed"
    elif choice == 7:
        e["signature"] = rng.choice(["", "0" * 64, e["signature"].upper(), e["signature"][:-1], e["signature"] * 2,
                                     "\ud800", "x" * 100000, " " + e["signature"]])
        how = f"signature = {_short(e['signature'])}"
    elif choice == 8:
        e["signature"] = rng.choice([None, 1, [], {}, True, NAN])
        how = f"signature of type {type(e['signature']).__name__}"
    elif choice == 9:
        other = parts.manifest["entries"][1 - i]
        e["signature"], other["signature"] = other["signature"], e["signature"]
        how = "signatures swapped"
    elif choice == 10 and parts.blobs[i] is not None:
        blob = parts.blobs[i]
        assert blob is not None
        files = e["binaries"]["files"]
        j = rng.randrange(len(files))
        start = sum(f[4] for f in files[:j])
        data = b"forged binary"
        stored = zlib.compress(data)
        parts.set_blob(i, blob[:start] + stored + blob[start + files[j][4]:])
        files[j][2:5] = [hashlib.sha256(data).hexdigest(), len(data), len(stored)]
        e["binaries"]["size"] = len(parts.blobs[i] or b"")
        how = f"carried file {files[j][1]} replaced after signing, checksums recomputed"
    else:
        e["artifacts"] = {"inductor": {"count": 99, "bytes": 1}}
        how = "artifact counts changed after signing"
    return f"signed: entry {i} {how}", parts.build()


BAD_PATHS = ["../{E}", "24/../../{E}", "/{E}", "24/\x00x.so", "triton/../../{E}", "24/.hidden.so", "24/" + "a" * 300,
             "cache/../../{E}", "{ABS}/{E}.so", "..", "24/..", "aaaaaaaaa/x.so", "triton/short/x", "24/x.so\n",
             "24\\..\\..\\{E}"]


def m_binaries(rng: random.Random, seeds: Seeds, ctx: str) -> tuple[str, bytes]:
    name, data = _base(rng, seeds)
    parts = Parts.of(data)
    i = 0
    e = parts.manifest["entries"][i]
    section = e["binaries"]
    files = section["files"]
    blob = parts.blobs[i]
    assert blob is not None
    j = rng.randrange(len(files))
    choice = rng.randrange(7)
    if choice == 0:
        files[j][1] = rng.choice(BAD_PATHS).replace("{E}", ESCAPE).replace("{ABS}", ctx)
        how = f"carried file {j} named {_short(files[j][1])}"
    elif choice == 1:
        build = next(iter(section["builds"]))
        section["builds"][build]["compiler"] = "/tmp/evil-cc"
        how = "build identity forged (id kept)"
    elif choice == 2:
        forged = {"compiler": "x"}
        from pytest_compilecache.bundle.binaries import build_id

        bid = build_id(forged)
        section["builds"][bid] = forged
        files[j][0] = bid
        how = "a file moved to another, consistent build identity"
    elif choice == 3:
        size = rng.choice([10 ** 6, 20 * 10 ** 6])
        bomb = zlib.compress(b"\x00" * size, 9)
        start = sum(f[4] for f in files[:j])
        parts.blobs[i] = blob[:start] + bomb + blob[start + files[j][4]:]
        files[j][4] = len(bomb)
        how = f"carried file {j} is a zlib bomb of {size} bytes (stated size {files[j][3]})"
    elif choice == 4:
        start = sum(f[4] for f in files[:j])
        chunk = bytearray(blob[start:start + files[j][4]])
        chunk[rng.randrange(len(chunk))] ^= 0xFF
        parts.blobs[i] = blob[:start] + bytes(chunk) + blob[start + files[j][4]:]
        how = f"carried file {j} corrupted inside the blob"
    elif choice == 5:
        files[j][3] = rng.choice([0, 1, 2 ** 40, files[j][3] + 1])
        how = f"carried file {j} stated size {files[j][3]}"
    else:
        files.append(list(files[j]))
        section["size"] += files[j][4]
        parts.blobs[i] = blob + blob[sum(f[4] for f in files[:j]):][:files[j][4]]
        how = f"carried file {j} listed twice"
    new_blob = parts.blobs[i]
    assert new_blob is not None
    parts.set_blob(i, new_blob)
    return f"{name}: {how}, blob checksum recomputed", parts.build()


MUTATIONS: dict[str, Callable[[random.Random, Seeds, str], tuple[str, bytes]]] = {
    "bitflip": m_bitflip, "truncate": m_truncate, "extend": m_extend, "swap": m_swap, "offsets": m_offsets,
    "types": m_types, "numbers": m_numbers, "length": m_length, "structure": m_structure, "keys": m_keys,
    "payload": m_payload, "signature": m_signature, "binaries": m_binaries,
}


def generate(seeds: Seeds, seed: int, index: int, ctx: str) -> Case:
    """Case ``index`` of the run seeded ``seed`` (the same bytes every time for the same seeds and ``ctx``)."""
    kind = list(MUTATIONS)[index % len(MUTATIONS)]
    rng = random.Random(f"{seed}:{index}")
    how, data = MUTATIONS[kind](rng, seeds, ctx)
    return Case(index, kind, how, data)


# ---------------------------------------------------------------- the harness

handed: list[bytes] = []


def instrument() -> None:
    """Record every byte string handed to ``torch.compiler.load_cache_artifacts`` (then load it)."""
    import torch

    real = torch.compiler.load_cache_artifacts
    if getattr(real, "_fuzz_wrapped", False):
        return

    def wrapped(data: Any, *args: Any, **kwargs: Any) -> Any:
        handed.append(bytes(data))
        return real(data, *args, **kwargs)

    wrapped._fuzz_wrapped = True  # type: ignore[attr-defined]
    torch.compiler.load_cache_artifacts = wrapped


@dataclasses.dataclass
class Outcome:
    """What one case did, and every invariant it broke."""

    reader: str = ""
    loaded: dict[str, bool] = dataclasses.field(default_factory=dict)
    cli: Counter[str] = dataclasses.field(default_factory=Counter)
    violations: list[str] = dataclasses.field(default_factory=list)
    messages: list[str] = dataclasses.field(default_factory=list)


class Harness:
    """A work folder, a sandbox around the template the loader fills, and the checks."""

    def __init__(self, seeds: Seeds, root: Path) -> None:
        self.seeds = seeds
        self.root = root
        self.cases = root / "cases"
        self.scratch = root / "scratch"
        self.sandbox = root / "sandbox"
        self.template = self.sandbox / "l1" / "l2" / "l3" / "l4" / "l5" / "template"
        self.pool_root = self.sandbox / "pool"
        for folder in (self.cases, self.scratch, self.sandbox):
            folder.mkdir(parents=True, exist_ok=True)
        self.original = self.cases / "original.bundle"
        self.original.write_bytes(seeds.bundles["pair"])
        instrument()
        self.here = _torchapi.environment_fingerprint()
        self.identity = _torchapi.build_identity()

    @property
    def ctx(self) -> str:
        """Where absolute hostile paths point: inside the work folder, outside the sandbox."""
        return str(self.root / "abs")

    def run(self, case: Case) -> Outcome:
        out = Outcome()
        path = self.cases / "case.bundle"
        path.write_bytes(case.data)
        shas, file_shas = stated(case.data)

        def alarm(*_: Any) -> None:
            raise Hang()

        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
        try:
            for secret in (None, KEY):
                with key_set(secret):
                    label = "key" if secret else "nokey"
                    self._reader(path, secret, label, out)
                    self._prepare(path, secret, label, shas, file_shas, out)
                    self._cli(path, label, out)
        except Hang:
            out.violations.append(f"ran past {CASE_SECONDS} s")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        self._no_escape(out)
        return out

    def _reader(self, path: Path, secret: str | None, label: str, out: Outcome) -> None:
        try:
            with read_manifest(path) as bundle:
                bundle.find(self.here)
                bundle.mismatch(self.here)
                for entry in bundle.entries:
                    bundle.signature_problem(entry, (secret or OTHER_KEY).encode())
                for entry in bundle.entries:
                    try:
                        bundle.carried(entry)
                    except BundleError as exc:
                        self._names(str(exc), [path], f"reader[{label}] carried", out)
                bundle.read_all()
            result = "accepted"
        except (BundleError, FileNotFoundError) as exc:
            self._names(str(exc), [path], f"reader[{label}]", out)
            result = "rejected"
        except Hang:
            raise
        except BaseException as exc:
            out.violations.append(f"reader[{label}]: {type(exc).__name__} escaped:\n{_tb(exc)}")
            result = "crashed"
        out.reader = out.reader or result

    def _prepare(self, path: Path, secret: str | None, label: str, shas: set[str], file_shas: set[str],
                 out: Outcome) -> None:
        shutil.rmtree(self.pool_root, ignore_errors=True)
        shutil.rmtree(self.template, ignore_errors=True)
        handed.clear()
        store = LocalStore(path, 5.0)
        pool = BinaryPool(self.pool_root, self.identity)
        folders = types.SimpleNamespace(template=self.template, shared=self.sandbox)  # what loading uses of them
        no_hook = types.SimpleNamespace(hook=types.SimpleNamespace(pytest_compilecache_warmup=types.SimpleNamespace(
            get_hookimpls=list)))
        preparer = BundlePreparation(no_hook, Options(), folders, "fuzz", time.time(), store, BundleAtStart,
                                     contextlib.ExitStack(), None)
        try:
            loaded = preparer.load_or_warm_up(dict(self.here), pool)
        except Hang:
            raise
        except BaseException as exc:
            out.violations.append(f"prepare[{label}]: {type(exc).__name__} escaped:\n{_tb(exc)}")
            return
        out.loaded[label] = loaded
        for problem in preparer.process_report.problems:
            self._names(problem.text, [path], f"prepare[{label}] problem", out)
        if loaded:
            _torchapi.make_whole(self.template)  # every artifact read on demand, written now
        written = [p.read_bytes() for layer in ("fxgraph", "aotautograd") for p in (self.template / layer).rglob("*")
                   if p.is_file()]
        damaged = any("artifact" in p.text and "left out" in p.text for p in preparer.process_report.problems)
        if loaded and not handed and not written and not damaged:
            out.violations.append(f"prepare[{label}]: loaded, but torch was handed nothing, and it does not say why")
        for data in handed:
            whole = data in self.seeds.signed_payloads or hashlib.sha256(data).hexdigest() in shas
            parts = [hashlib.sha256(c).hexdigest() for *_, c in contents(data)]
            if secret is not None and not (data in self.seeds.signed_payloads
                                           or set(parts) <= self.seeds.signed_artifacts):
                out.violations.append(f"prepare[{label}]: torch was handed bytes that are not an original signed payload")
            if not whole and not set(parts) <= shas:
                out.violations.append(f"prepare[{label}]: torch was handed bytes whose sha256 no manifest entry states")
            for problem in self._escaping_keys(data):
                out.violations.append(f"prepare[{label}]: torch was handed {problem}")
        for data in written:
            sha = hashlib.sha256(data).hexdigest()
            if secret is not None and sha not in self.seeds.signed_artifacts:
                out.violations.append(f"prepare[{label}]: an artifact read on demand is not an original signed one")
            if sha not in shas:
                out.violations.append(f"prepare[{label}]: an artifact read on demand has a sha256 no table states")
        _torchapi.fill_from(self.template, None)
        for rel, file in torch_layout.find_binaries(pool.path).items():
            sha = hashlib.sha256(file.read_bytes()).hexdigest()
            if secret is not None and sha not in self.seeds.signed_binaries:
                out.violations.append(f"prepare[{label}]: pooled binary {rel} is not an original signed one")
            if sha not in file_shas:
                out.violations.append(f"prepare[{label}]: pooled binary {rel} has a sha256 the manifest does not state")
        handed.clear()

    def _escaping_keys(self, data: bytes) -> list[str]:
        """Artifact keys that, joined onto a cache subfolder, would lie outside the cache folder."""
        base = os.path.realpath(self.template)
        problems = []
        for kind, items in _deserialize(data).items():
            for artifact in items:
                key = artifact.key
                joined = os.path.normpath(os.path.join(base, "sub", "xx", str(key)))
                if not isinstance(key, str) or "\x00" in key or os.path.isabs(key) or "\\" in key \
                        or not joined.startswith(base + os.sep):
                    problems.append(f"a {kind} artifact keyed {_short(key)}")
        return problems

    def _cli(self, path: Path, label: str, out: Outcome) -> None:
        out_path = self.scratch / "merged.bundle"
        copy = self.scratch / "pruned.bundle"
        commands: list[tuple[list[str], list[Path], Path | None]] = [
            (["inspect", str(path)], [path], None),
            (["inspect", "--json", str(path)], [path], None),
            (["verify", str(path)], [path], None),
            (["merge", str(self.original), str(path), "-o", str(out_path)], [path, out_path, self.original], None),
            (["prune", str(copy), "--drop", "0"], [copy], copy),
        ]
        if label == "nokey":
            commands += [
                (["merge", str(path), "-o", str(out_path)], [path, out_path], None),
                (["prune", str(copy), "--drop", f"device={FOREIGN_DEVICE}"], [copy], copy),
                (["prune", str(copy), "--keep-matching"], [copy], copy),
            ]
        for argv, names, fresh in commands:
            for leftover in (out_path, copy):
                leftover.unlink(missing_ok=True)
            if fresh is not None:
                shutil.copyfile(path, fresh)
            name = f"{' '.join(a for a in argv if not a.startswith('/'))}[{label}]"
            handed.clear()
            stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
            stderr = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
            try:
                with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                    rc = cli.main(argv)
                    stdout.flush()
                    stderr.flush()
            except Hang:
                raise
            except BaseException as exc:
                out.violations.append(f"{name}: {type(exc).__name__} escaped:\n{_tb(exc)}")
                continue
            err = stderr.buffer.getvalue().decode("utf-8", "replace")  # type: ignore[attr-defined]
            out.cli[f"{argv[0]} rc={rc}"] += 1
            if rc not in (0, 1, 2):
                out.violations.append(f"{name}: exit status {rc!r}")
            if "Traceback" in err:
                out.violations.append(f"{name}: a traceback on stderr:\n{err}")
            if rc != 0:
                lines = err.rstrip("\n").split("\n")
                if len(lines) != 1:
                    out.violations.append(f"{name}: {len(lines)} lines on stderr, not one: {err[:300]!r}")
                self._names(err, names, name, out)
            if handed:
                out.violations.append(f"{name}: the CLI handed bytes to torch's loader")

    def _names(self, message: str, names: list[Path], where: str, out: Outcome) -> None:
        out.messages.append(message)
        if not any(str(n) in message for n in names):
            out.violations.append(f"{where}: the message does not name the file: {message[:300]!r}")

    def _no_escape(self, out: Outcome) -> None:
        """Nothing beside the template and the pool in the sandbox; nothing named for an escape anywhere near."""
        allowed = [str(self.template), str(self.pool_root)]
        for dirpath, dirnames, filenames in os.walk(self.sandbox):
            for name in filenames + dirnames:
                full = os.path.join(dirpath, name)
                inside = any(full == a or full.startswith(a + os.sep) or a.startswith(full + os.sep) for a in allowed)
                if not inside:
                    out.violations.append(f"written outside the template folder: {full}")
        for folder in (self.root, self.root.parent, self.root / "abs", self.cases, self.scratch):
            with contextlib.suppress(OSError):
                for item in folder.iterdir():
                    if ESCAPE in item.name or item.name == "abs":
                        out.violations.append(f"written outside the template folder: {item}")
        for leftover in list(self.sandbox.iterdir()):
            if str(leftover) not in allowed and not str(self.template).startswith(str(leftover) + os.sep):
                shutil.rmtree(leftover, ignore_errors=True)
                with contextlib.suppress(OSError):
                    leftover.unlink()
        for leftover in list(self.root.iterdir()) + list(self.root.parent.iterdir()):
            if ESCAPE in leftover.name or leftover.name == "abs":
                shutil.rmtree(leftover, ignore_errors=True)
                with contextlib.suppress(OSError):
                    leftover.unlink()


def _tb(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:]


# ---------------------------------------------------------------- the run


@dataclasses.dataclass
class Tally:
    """Counts per mutation class."""

    cases: Counter[str] = dataclasses.field(default_factory=Counter)
    reader: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)
    loaded: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)
    cli: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)
    seconds: Counter[str] = dataclasses.field(default_factory=Counter)
    slowest: tuple[float, int] = (0.0, -1)

    def add(self, case: Case, outcome: Outcome, seconds: float) -> None:
        self.cases[case.kind] += 1
        self.reader[(case.kind, outcome.reader)] += 1
        for label, loaded in outcome.loaded.items():
            self.loaded[(case.kind, f"{label}:{'loaded' if loaded else 'refused'}")] += 1
        for key, n in outcome.cli.items():
            self.cli[(case.kind, key)] += n
        self.seconds[case.kind] += seconds
        self.slowest = max(self.slowest, (seconds, case.index))

    def report(self) -> str:
        lines = [f"{'class':10} {'cases':>6} {'reader ok':>9} {'rejected':>8} {'loaded':>11} {'refused':>11}"
                 f" {'verify 0/1/2':>14} {'seconds':>8}"]
        for kind in MUTATIONS:
            n = self.cases[kind]
            if not n:
                continue
            verify = "/".join(str(self.cli[(kind, f"verify rc={rc}")]) for rc in (0, 1, 2))
            loaded = f"{self.loaded[(kind, 'nokey:loaded')]}+{self.loaded[(kind, 'key:loaded')]}"
            refused = f"{self.loaded[(kind, 'nokey:refused')]}+{self.loaded[(kind, 'key:refused')]}"
            lines.append(f"{kind:10} {n:6d} {self.reader[(kind, 'accepted')]:9d} {self.reader[(kind, 'rejected')]:8d}"
                         f" {loaded:>11} {refused:>11} {verify:>14} {self.seconds[kind]:8.1f}")
        total = sum(self.cases.values())
        lines.append(f"{'total':10} {total:6d} {sum(v for (_, r), v in self.reader.items() if r == 'accepted'):9d}"
                     f" {sum(v for (_, r), v in self.reader.items() if r == 'rejected'):8d}")
        lines.append("loaded/refused: by BundlePreparation.load_or_warm_up without+with the key; reader ok/rejected: without the key")
        commands: Counter[str] = Counter()
        for (_, key), n in self.cli.items():
            commands[key] += n
        lines.append("CLI exit statuses (both key settings): " + ", ".join(f"{k}: {v}" for k, v in sorted(commands.items())))
        lines.append(f"slowest case: {self.slowest[1]} ({self.slowest[0]:.2f} s)")
        return "\n".join(lines)


def run_cases(harness: Harness, seed: int, indices: range | list[int], verbose: bool = False,
              progress: Callable[[str], None] | None = None) -> tuple[Tally, list[tuple[Case, Outcome]]]:
    """Generate and run the cases; the tally and the cases that broke an invariant."""
    tally = Tally()
    failed = []
    for n, index in enumerate(indices):
        case = generate(harness.seeds, seed, index, harness.ctx)
        start = time.perf_counter()
        outcome = harness.run(case)
        tally.add(case, outcome, time.perf_counter() - start)
        if verbose:
            print(f"case {index} [{case.kind}] {case.how}: reader {outcome.reader}, loaded {outcome.loaded}, "
                  f"cli {dict(outcome.cli)}")
            for message in outcome.messages[:3]:
                print(f"    {message[:200]}")
        if outcome.violations:
            failed.append((case, outcome))
        if progress and n and n % 500 == 0:
            progress(f"{n} cases, {len(failed)} failing")
    return tally, failed


def describe_failure(seed: int, case: Case, outcome: Outcome) -> str:
    lines = [f"VIOLATION in case {case.index} [{case.kind}] {case.how}",
             f"  replay: python scripts/fuzz_bundles.py --seed {seed} --only {case.index} -v"]
    lines += ["  " + v.replace("\n", "\n    ") for v in outcome.violations[:6]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--only", type=int, action="append", help="run only this case (repeatable)")
    p.add_argument("--bundle", type=Path, help="a real bundle to start from (default: make one with torch.compile)")
    p.add_argument("--workdir", type=Path, help="default: a new folder under /dev/shm or the temp folder")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="fuzz-bundles-", dir=args.workdir or base))
    started = time.perf_counter()
    try:
        real = args.bundle or build_real_bundle(root / "real")
        built = time.perf_counter() - started
        seeds = Seeds.from_real(real, root / "seeds")
        harness = Harness(seeds, root / "run")
        print(f"seed {args.seed}; real bundle {real} ({len(seeds.bundles['plain'])} bytes, "
              f"made in {built:.1f} s); torch {_torchapi.environment_fingerprint()['torch']}; work folder {root}")
        indices = args.only or range(args.start, args.start + args.count)
        run_start = time.perf_counter()
        tally, failed = run_cases(harness, args.seed, indices, args.verbose,
                                  lambda s: print(f"  ... {s}, {time.perf_counter() - run_start:.0f} s", flush=True))
        elapsed = time.perf_counter() - run_start
        print(tally.report())
        print(f"{len(indices)} cases in {elapsed:.1f} s ({elapsed / max(1, len(indices)) * 1000:.1f} ms a case, "
              f"each through the reader and BundlePreparation.load_or_warm_up with and without {signing.KEY_ENV}, 10 CLI commands without it and 5 of them with it); "
              f"total {time.perf_counter() - started:.1f} s")
        for case, outcome in failed[:20]:
            print(describe_failure(args.seed, case, outcome))
        print(f"{len(failed)} case(s) broke an invariant" if failed else "no invariant broken")
        return 1 if failed else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
