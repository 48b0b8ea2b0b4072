"""Signed bundle entries: an HMAC-SHA256 keyed from ``PYTEST_COMPILE_CACHE_KEY`` (docs/file-format.md#signature)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any, Mapping, Sequence

KEY_ENV = "PYTEST_COMPILE_CACHE_KEY"
UNSIGNED = "unsigned"
MISMATCH = "signature does not match"


def key() -> bytes | None:
    """The signing key from the environment, or None when it is unset or empty."""
    return os.environ.get(KEY_ENV, "").encode() or None


def _signed_fields(described: Mapping[str, Any], binaries: Mapping[str, Any] | None) -> bytes:
    fields = {k: v for k, v in described.items() if k not in ("offset", "signature", "binaries")}
    if isinstance(fields.get("index"), Mapping):
        fields["index"] = {k: v for k, v in fields["index"].items() if k != "offset"}
    if binaries is not None:
        fields["binaries"] = {k: v for k, v in binaries.items() if k != "offset"}
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def sign(described: Mapping[str, Any], binaries: Mapping[str, Any] | None, secret: bytes) -> str:
    """The hex HMAC-SHA256 of an entry's manifest fields (``described``) and binaries section."""
    return hmac.new(secret, _signed_fields(described, binaries), hashlib.sha256).hexdigest()


def check(described: Mapping[str, Any], binaries: Mapping[str, Any] | None, signature: str,
          secret: bytes) -> str:
    """``""`` when ``signature`` is valid for the entry, otherwise why not (:data:`UNSIGNED` or :data:`MISMATCH`)."""
    if not signature:
        return UNSIGNED
    given = signature.encode("utf-8", "surrogatepass")
    return "" if hmac.compare_digest(sign(described, binaries, secret).encode(), given) else MISMATCH


def seal(supersedes: Sequence[str], written: float, secret: bytes) -> str:
    """The signature of a pack's list of the packs it replaces and of when it was written (docs/urls.md)."""
    return sign({"supersedes": list(supersedes), "written": written}, None, secret)
