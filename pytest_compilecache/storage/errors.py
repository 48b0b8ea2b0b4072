"""What a store's client raised: a failure said in words, and whether reading again may help."""

from __future__ import annotations


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
    """Whether a read that raised ``exc`` may succeed if read again (a reset, a stall, a short answer)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    if type(exc).__name__ in ("TooManyRedirects", "InvalidURL", "NoCredentialsError", "ClientAuthenticationError"):
        return False
    return isinstance(exc, (OSError, TimeoutError, ConnectionError)) or any(
        word in type(exc).__name__ for word in ("Timeout", "Connection", "Payload", "Disconnected", "Incomplete"))
