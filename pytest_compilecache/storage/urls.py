"""Bundle URLs as text: telling them from paths, ``file://`` paths, storage options, and showing them safely."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

from ..bundle.format import BundleError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")  # one letter is a Windows drive, not a scheme

#: The environment variable of fsspec options for bundle URLs (a JSON object), over ``compile_cache_storage_options``.
STORAGE_OPTIONS_ENV = "PYTEST_COMPILE_CACHE_STORAGE_OPTIONS"


def is_url(text: str) -> bool:
    """Whether ``text`` names a bundle by URL rather than by a local path (``file://`` is a path)."""
    return bool(_URL.match(text)) and not text.lower().startswith("file://")


def file_url_path(text: str) -> str | None:
    """The local path a ``file://`` URL names (:class:`BundleError` for another host's), else ``None``."""
    if not text.lower().startswith("file://"):
        return None
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost"):
        raise BundleError(f"{text}: a file:// URL names a path on this machine: file:///absolute/path "
                          f"(not the host {parts.netloc!r})")
    from urllib.request import url2pathname  # here: urllib.request pulls in http, email and ssl (about 10 ms)
    return url2pathname(parts.path)


def parse_storage_options(text: str) -> dict[str, Any]:
    """fsspec options written as a JSON object; raises ValueError saying what is wrong."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError('must be a JSON object, e.g. {"endpoint_url": "http://127.0.0.1:9000"}')
    return value


def redacted(url: str) -> str:
    """``url`` as messages show it: without a ``user:password@`` or a query, which can carry credentials
    (a ``name@host`` without a password stays: adlfs writes ``abfs://container@account...``)."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    secret = bool(at) and ":" in userinfo
    if not secret and not parts.query and not parts.fragment:
        return url
    return f"{parts.scheme}://{host if secret else parts.netloc}{parts.path}"
