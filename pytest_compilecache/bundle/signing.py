"""Signed bundle entries: an HMAC-SHA256, with a key from the environment, over what an entry says.

The key is read only from ``PYTEST_COMPILE_CACHE_KEY``: never from the command line, never written
anywhere. The signature covers every manifest field of an entry except where it lies in the file
(so rewriting a bundle keeps it valid): its environment, artifact counts, dates, history, the
payload's size and SHA-256, the carried binaries' listing and blob checksum, and the key index's
size and checksum. Since every payload
and binary is checked against those checksums before use, a valid signature vouches for the bytes
too.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any, Mapping

KEY_ENV = "PYTEST_COMPILE_CACHE_KEY"
UNSIGNED = "unsigned"
MISMATCH = "signature does not match"


def key() -> bytes | None:
    """The signing key from the environment, or None when it is unset or empty."""
    value = os.environ.get(KEY_ENV, "")
    return value.encode() if value else None


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
