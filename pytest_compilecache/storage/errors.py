"""What a store's client raised, classified: a lost conditional write, or a failure said in words."""

from __future__ import annotations


class Conflict(Exception):
    """A conditional write found the object changed (or created) by another writer."""


class NoConditionalWrite(Exception):
    """The store offers no conditional write that this plugin knows how to use."""


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


def precondition_failed(exc: BaseException) -> bool:
    """Whether a store's error is its answer to a conditional write whose condition did not hold."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        error = response.get("Error") if isinstance(response, dict) else None
        code = error.get("Code") if isinstance(error, dict) else None
        if (code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
                or isinstance(seen, FileExistsError) or getattr(seen, "status_code", None) in (409, 412)):  # Azure's
            return True
        seen = seen.__cause__ or seen.__context__
    text = str(exc).lower()
    return "precondition" in text or "pre-condition" in text


def transient(exc: BaseException) -> bool:
    """Whether a read that raised ``exc`` may succeed if read again (a reset, a stall, a short answer)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, Conflict, NoConditionalWrite)):
        return False
    if type(exc).__name__ in ("TooManyRedirects", "InvalidURL", "NoCredentialsError", "ClientAuthenticationError"):
        return False
    return isinstance(exc, (OSError, TimeoutError, ConnectionError)) or any(
        word in type(exc).__name__ for word in ("Timeout", "Connection", "Payload", "Disconnected", "Incomplete"))
