"""How a failed call of the Kubernetes client becomes one :class:`ApiCallError` naming the call (:func:`call_error`).

Whatever the client library raised for it: the API server's error status (with its message and
code), no answer in time, an error answer lightkube's own handling trips over (a redirect, an
answer without a ``Content-Type``: its status and a few words of its body), an answer that does
not decode as its model (``the answer does not decode: Expected str, got int @ $.status.…``), or
anything else (its type and text). A ``Retry-After`` the server sent (a 429, a 503) is kept as
``retry_after`` seconds (:func:`retry_after`).
"""

from __future__ import annotations

import httpx2
import msgspec
from lightkube.core.exceptions import ApiError

from cdiplug.errors import KubernetesError

RETRY_AFTER_MAX = 300.0  # a longer Retry-After is not believed


class ApiCallError(KubernetesError):
    """A call that failed: ``what`` was asked of the server ``where``; ``detail`` is the server's or the transport's word."""

    def __init__(self, what: str, where: str, detail: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(f"{what} on {where}: {detail}", status)
        self.what, self.where, self.detail = what, where, detail
        self.retry_after = retry_after  # seconds the server asked us to wait (Retry-After), if it did


def retry_after(exc: BaseException) -> float | None:
    """The seconds a failed call's server asked to wait before the next (``Retry-After``); None when it did not."""
    value = getattr(exc, "retry_after", None)
    return float(value) if isinstance(value, (int, float)) else None


def _retry_after(response: httpx2.Response | None) -> float | None:
    header = response.headers.get("retry-after") if response is not None else None
    try:
        seconds = float(header) if header else None
    except ValueError:
        return None  # an HTTP date: not worth believing
    return min(max(seconds, 0.0), RETRY_AFTER_MAX) if seconds is not None else None


def _status_error(exc: BaseException) -> httpx2.HTTPStatusError | None:
    """The error answer behind ``exc`` (itself, or what it was raised while handling)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, httpx2.HTTPStatusError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _answer(error: httpx2.HTTPStatusError) -> str:
    """An error answer in a few words: ``HTTP 500 Internal Server Error: <body>``, a redirect with its target."""
    response = error.response
    words = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
    location = response.headers.get("location")
    if response.is_redirect and location:
        return f"{words} to {location} (redirects are not followed)"
    try:
        body = " ".join(response.text.split())[:200]
    except (httpx2.ResponseNotRead, UnicodeDecodeError):
        body = ""
    return f"{words}: {body}" if body else words


def _decode_error(exc: msgspec.ValidationError | msgspec.DecodeError) -> str:
    """msgspec's ``Expected `str`, got `int` - at `$.a[0].b``` as ``expected str, got int @ $.a[0].b``."""
    message, at, path = str(exc).rpartition(" - at `")
    return f"{message.replace('`', '')} @ {path.rstrip('`')}" if at else str(exc)


def call_error(what: str, where: str, exc: BaseException, timeout: float) -> ApiCallError:
    """``exc``, raised by the call ``what`` on the server ``where`` (bounded by ``timeout`` seconds), as our error."""
    if isinstance(exc, ApiError):
        status = exc.status
        code = int(status.code) if status is not None and status.code is not None else None
        message = status.message if status is not None and status.message else str(exc)
        return ApiCallError(what, where, message, code, _retry_after(getattr(exc, "response", None)))
    if isinstance(exc, TimeoutError):
        return ApiCallError(what, where, f"no answer within {timeout:g} s")
    answer = _status_error(exc)
    if answer is not None:
        response = answer.response
        return ApiCallError(what, where, _answer(answer), response.status_code, _retry_after(response))
    if isinstance(exc, msgspec.ValidationError | msgspec.DecodeError):
        return ApiCallError(what, where, f"the answer does not decode: {_decode_error(exc)}")
    return ApiCallError(what, where, f"{type(exc).__name__}: {exc}")
