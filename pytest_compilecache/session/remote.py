"""torch's own remote (Redis) compile caches, switched on for a session and made observable.

torch can share FX graph, AOTAutograd and autotune results through Redis, but a server it cannot
reach makes its backend switch itself off in silence, and every lookup then misses. This module
turns those caches on for a session from one URL and checks, before any test, that the server
answers. It never imports torch; the ``redis`` package is imported only when a URL is given.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

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


def environment(url: str) -> dict[str, str]:
    """The variables that switch torch's remote FX graph, AOTAutograd and autotune caches on for ``url``."""
    return {**{name: "1" for name in ENVIRONMENT[:3]}, "TORCHINDUCTOR_REDIS_URL": url}


def switch_on(url: str) -> dict[str, str | None]:
    """Set :func:`environment` in ``os.environ``; the values before, to :func:`restore`."""
    before = {name: os.environ.get(name) for name in ENVIRONMENT}
    os.environ.update(environment(url))
    return before


def restore(before: dict[str, str | None]) -> None:
    """Put the variables :func:`switch_on` changed back as they were (deleted if they were unset)."""
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def unreachable(url: str) -> str:
    """``""`` when the server at ``url`` answers a PING; otherwise why not, in words."""
    try:
        import redis
    except ImportError:
        return ("the redis package is not installed, so torch cannot use a remote cache "
                "(pip install 'pytest-compilecache[redis]')")
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=PING_SECONDS, socket_timeout=PING_SECONDS)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # any client error means torch's backend would switch itself off
        return f"{type(exc).__name__}: {exc}"
    return ""
