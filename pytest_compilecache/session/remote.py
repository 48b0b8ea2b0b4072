"""torch's own remote (Redis) compile caches, switched on for a session from one URL, and a check that the server
answers (torch's backend switches itself off in silence); never imports torch, and ``redis`` only for a URL."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from ..environment import SavedEnv

#: What torch reads to switch its remote caches on and to find the server.
ENVIRONMENT = ("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
               "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE", "TORCHINDUCTOR_REDIS_URL")
SCHEMES = ("redis", "rediss", "unix")
PING_SECONDS = 3.0


def check_url(url: str) -> str:
    """``""`` when ``url`` names a Redis server as torch's cache accepts it, otherwise why not."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        return f"{url!r} is not a Redis URL (use redis://HOST:PORT[/DB], rediss://... or unix://PATH)"
    if parts.scheme != "unix" and not parts.hostname:
        return f"{url!r} names no host (use redis://HOST:PORT[/DB])"
    try:
        parts.port
    except ValueError:
        return f"{url!r} has a port that is not a number"
    return ""


def switch_on(url: str) -> SavedEnv:
    """Switch torch's remote FX graph, AOTAutograd and autotune caches on for ``url``; the variables as they were."""
    before = SavedEnv(ENVIRONMENT)
    os.environ.update({**{name: "1" for name in ENVIRONMENT[:3]}, "TORCHINDUCTOR_REDIS_URL": url})
    return before


def unreachable(url: str) -> str:
    """``""`` when the server at ``url`` answers a PING; otherwise why not, in words."""
    try:
        import redis
    except ImportError:
        return ("the redis package is not installed, so torch cannot use a remote cache "
                "(pip install 'pytest-compilecache[redis]')")
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=PING_SECONDS, socket_timeout=PING_SECONDS) as client:
            client.ping()
    except Exception as exc:  # any client error means torch's backend would switch itself off
        return f"{type(exc).__name__}: {exc}"
    return ""
