"""How a store fails: the errors said, how long it may take, and a client's exception in words."""

from __future__ import annotations

from ..bundle.format import BundleError

#: Seconds a store may take to answer a request (connect and first byte), and to go on sending.
DEFAULT_TIMEOUT = 30.0
#: The slowest transfer rate waited for (bytes a second): a transfer of N bytes gets N / MIN_RATE seconds more.
MIN_RATE = 25_000


class StoreError(BundleError):
    """A store that failed to answer, or answered with an error: the network's or the server's fault, not a pack's."""


class StoreTimeout(StoreError):
    """A store did not answer within its deadline (or gave no answer earlier in this process)."""


def why(exc: BaseException) -> str:
    """An exception from a store's client, in words."""
    if isinstance(exc, FileNotFoundError):
        detail = str(exc.strerror or "") if exc.strerror else str(exc)
        return f"no such object or bucket ({detail})" if detail else "no such object or bucket"
    if isinstance(exc, PermissionError):
        return f"access denied ({exc}); check the credentials"
    name = type(exc).__name__
    if name == "TooManyRedirects":
        return "too many redirects (a redirect loop)"
    if name in ("ClientPayloadError", "ContentLengthError", "IncompleteRead") or "payload is not completed" in str(exc):
        return ("the answer was shorter than the Content-Length it announced (a connection cut midway, "
                "or a server that lies)")
    text = str(exc) or type(exc).__name__
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"


def transient(exc: BaseException) -> bool:
    """Whether a request that raised ``exc`` may succeed if sent again (a reset, a stall, a short answer; not a
    redirect loop, a bad URL or missing credentials, whose clients' errors are neither OSErrors nor named so)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    return isinstance(exc, (OSError, TimeoutError)) or any(
        word in type(exc).__name__ for word in ("Timeout", "Connection", "Payload", "Disconnected", "Incomplete"))
