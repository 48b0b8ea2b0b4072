"""Writing a bundle file: atomically, its members copied as stored, each entry signed where it may be."""

from __future__ import annotations

import json
from typing import Any, Iterator

from .. import files
from . import signing
from .binaries import BinaryDamaged
from .format import FORMAT, MAGIC, Bundle, BundleError, Entry
from .labels import env_label


def write_bundle(bundle: Bundle) -> int:
    """Write ``bundle`` atomically (a file beside it, fsynced, renamed into place); returns the file size. With the
    signing key set, only an entry made here or validly signed is signed: a write vouches only for what it checked.
    Members are copied as stored, a chunk at a time: writing holds no bundle in memory."""
    path = bundle.path
    chunks, _, placed = _encode(bundle)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        size = files.write_atomic(path, chunks)
    except OSError as exc:
        raise BundleError(f"{path}: cannot write: {exc.strerror or exc}; the file there is unchanged") from None
    for entry, signature, description in placed:
        entry.signature = signature
        entry.binaries_section = description.get("binaries")
        entry.index_section = description.get("index")
    return size


def encoded_size(bundle: Bundle) -> int:
    """How many bytes :func:`write_bundle` would write for ``bundle``."""
    return _encode(bundle)[1]


def _members_of(entry: Entry) -> Iterator[bytes]:
    members = entry._members
    assert members is not None and entry._table is not None
    yield entry._table
    for member in members.table:
        try:
            raw = members.raw(member)
        except OSError as exc:
            raise BundleError(f"the {member} of {env_label(entry.env)} cannot be read where it is read from: "
                              f"{exc.strerror or exc}; nothing was written") from None
        if len(raw) != member.stored:
            raise BundleError(f"the {member} of {env_label(entry.env)} is cut short where it is read from; "
                              "nothing was written")
        yield raw


def _encode(bundle: Bundle) -> tuple[Iterator[bytes], int, list[tuple[Entry, str, dict[str, Any]]]]:
    """The file's bytes (members read as they are written), their length, and per entry the signature and
    manifest description they give it."""
    secret = signing.key()
    parts: list[Any] = []  # an entry's table and members, a section's chunks, or bytes
    placed = []
    at = 0
    for entry in bundle.entries:
        may_sign = secret is not None and not entry.vouched(secret)
        bundle.members(entry)
        description = {**entry.describe(), "offset": at}
        parts.append(entry)
        at += entry.size + entry.stored
        carried, _ = bundle.carried(entry)
        section = None
        if carried:
            try:
                blob, section = carried.packed()
            except BinaryDamaged as exc:
                raise BundleError(f"{exc} where it is read from; nothing was written") from None
            description["binaries"] = {**section, "offset": at}
            parts.append(blob)
            at += section["size"]
        bundle.read_key_index(entry)  # copied as stored, never unpacked for it
        index = entry.index_blob()
        if index is not None:
            description["index"] = {**description["index"], "offset": at}
            parts.append(index)
            at += len(index)
        else:
            description.pop("index", None)
        signature = signing.sign(entry.describe(), section, secret) if may_sign and secret else entry.signature
        if signature:
            description["signature"] = signature
        placed.append((entry, signature, description))
    top: dict[str, Any] = {"format": FORMAT, "entries": [d for *_, d in placed]}
    if bundle.written:
        top.update(written=bundle.written, supersedes=list(bundle.supersedes))
        if secret is not None:
            top["seal"] = signing.seal(bundle.supersedes, bundle.written, secret)
    manifest = json.dumps(top, indent=1, sort_keys=True).encode()
    head = [MAGIC, b"%d\n" % len(manifest), manifest]

    def chunks() -> Iterator[bytes]:
        yield from head
        for part in parts:
            if isinstance(part, Entry):
                yield from _members_of(part)
            elif callable(part):
                try:
                    yield from part()
                except BinaryDamaged as exc:
                    raise BundleError(f"{exc} where it is read from; nothing was written") from None
            else:
                yield part

    return chunks(), sum(map(len, head)) + at, placed
