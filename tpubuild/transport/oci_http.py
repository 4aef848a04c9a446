"""One request to an OCI registry: a deadline on the whole of it, bounded retries, the
registry's challenge answered (transport/oci_auth.py), bodies sent and answers read a
piece at a time. Below transport/oci.py, which speaks the distribution API with it.

The HTTP library is `requests` (already installed with TensorFlow, which requires it):
it takes proxies from the environment (HTTPS_PROXY, NO_PROXY) and CA bundles
(REQUESTS_CA_BUNDLE) as the ecosystem's Python tools do, verifies TLS by default, and
drops the Authorization header when a redirect leaves the registry's host (a blob GET
is redirected to the storage behind the registry: S3, GCS; requests/sessions.py
`rebuild_auth`, `should_strip_auth`), so no credential reaches the storage. It is
imported when a registry is first spoken to, never by planning commands.

Deadlines (`Timeouts`, as for buckets: remote_cache's connect_timeout, first_byte_timeout,
total_timeout): each attempt connects within `connect` and waits at most `first_byte`
for each read of the answer (requests' `timeout=(connect, read)`); the whole call, its
retries included, ends at its deadline (`total`, or an upload's and a download's
`Timeouts.upload_deadline` of its size): a body is read from its file piece by piece by
the sending socket, and each piece checks the deadline first; an answer is read in
pieces, each checking it. Retries: ATTEMPTS in all on a connection error, a read that
timed out, or HTTP 429/500/502/503/504 (Retry-After honoured within the deadline); an
answer that is the registry's refusal (4xx) is said at once, as one line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO, Callable
from urllib.parse import urlsplit

from tpubuild.config.remote_url import OciAddress, Timeouts
from tpubuild.transport.oci_auth import Authorizer, Credentials, RegistryAuthError

if TYPE_CHECKING:
    import requests

ATTEMPTS = 3
RETRIED_STATUS = {429, 500, 502, 503, 504}
ERROR_LIMIT = 64 << 10  # a registry's error document is small; more is not read
PIECE = 1 << 16  # what one read of an answer takes


class RegistryError(Exception):
    """The registry's refusal or a failure speaking to it: one line (`status` and the
    distribution spec's error `code` when it answered)."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


class RegistryUnreachable(RegistryError):
    """No (complete) answer: a connection refused or cut, a deadline passed."""


class AnswerTooLarge(RegistryError):
    """An answer larger than the caller reads (a manifest over its limit)."""


class _Deadline(Exception):
    pass


class Body:
    """A request body of `length` bytes read from `source(offset)` (a binary file object
    positioned there), a piece at a time as the socket sends it: never whole in memory.
    Each read checks the deadline (a registry that reads a byte a minute is cut off)."""

    def __init__(self, source: Callable[[int], BinaryIO], offset: int, length: int):
        self.source, self.offset, self.length = source, offset, length
        self.deadline = float("inf")
        self._file: BinaryIO | None = None
        self._left = length

    def __len__(self) -> int:  # requests' super_len: the Content-Length, no chunked encoding
        return self.length

    def start(self, deadline: float) -> None:
        self.close()
        self.deadline = deadline
        self._file = self.source(self.offset)
        self._left = self.length

    def read(self, size: int = -1) -> bytes:
        if time.monotonic() > self.deadline:
            raise _Deadline()
        if self._file is None or self._left <= 0:
            return b""
        size = self._left if size is None or size < 0 else min(size, self._left)
        data = self._file.read(size)
        if not data and self._left:
            raise OSError(f"the file ended {self._left} bytes early (changed while it was sent?)")
        self._left -= len(data)
        return data

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _Header:
    """requests' auth hook: our Authorization header (or none). Given as `auth=`, it also
    keeps requests from reading ~/.netrc for the registry."""

    def __init__(self, value: str | None):
        self.value = value

    def __call__(self, request: Any) -> Any:
        if self.value:
            request.headers["Authorization"] = self.value
        return request


class Http:
    """Requests to one registry (`address.host`), over HTTPS, or plain HTTP when `plain`."""

    def __init__(self, address: OciAddress, timeouts: Timeouts | None = None, plain: bool = False,
                 credentials: Callable[[], Credentials | None] | None = None):
        import requests

        from tpubuild import __version__

        self._requests = requests
        self.address = address
        self.timeouts = timeouts or Timeouts()
        self.plain = plain
        self.base = f"{'http' if plain else 'https'}://{address.host}"
        self.session = requests.Session()
        self.session.headers["User-Agent"] = f"tpubuild/{__version__}"
        self.auth = Authorizer(address.host, self._realm, self._realm_allowed, credentials)

    # --- one call --------------------------------------------------------------------
    def url(self, target: str) -> str:
        """`target` (a path, or a URL the registry gave: an upload's Location) as a URL of
        this registry. A Location on another host is refused: the registry's answers are
        data, and credentials go to its own host only."""
        if target.startswith("/"):
            return self.base + target
        parts = urlsplit(target)
        if f"{parts.scheme}://{parts.netloc}" != self.base:
            raise RegistryError(f"{self.address.host} sent a location on another host or scheme "
                                f"({parts.scheme}://{parts.netloc[:80]}); not followed")
        return target

    def request(self, method: str, target: str, *, what: str, scope: str, expect: tuple[int, ...],
                headers: dict[str, str] | None = None, body: bytes | Body | None = None,
                budget: float | None = None, redirects: bool = False, attempts: int = ATTEMPTS
                ) -> requests.Response:
        """`method target` until an answer in `expect` (returned unread: read it with
        `read` or `copy`), within `budget` seconds (the total timeout by default); a
        refusal, or no answer by then, raises a RegistryError saying `what` failed.
        `attempts`: how many times a connection error or a retried status is tried (1 for
        a step of an upload: the registry may have taken part of its body, so the upload,
        not the request, is what is tried again: transport/oci.py push_blob)."""
        return self._send(method, self.url(target), what=what, scope=scope, expect=expect, headers=headers,
                          body=body, budget=budget, redirects=redirects, authorize=True, attempts=attempts)

    def _send(self, method: str, url: str, *, what: str, scope: str, expect: tuple[int, ...],
              headers: dict[str, str] | None, body: bytes | Body | None, budget: float | None,
              redirects: bool, authorize: bool, deadline: float | None = None,
              attempts: int = ATTEMPTS) -> requests.Response:
        requests = self._requests
        budget = budget or self.timeouts.total
        deadline = deadline or time.monotonic() + budget
        failures = 0
        challenged = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RegistryUnreachable(f"{what}: no complete answer within {budget:g} s")
            sent = self.auth.header(scope) if authorize else None
            if isinstance(body, Body):
                body.start(deadline)
            try:
                answer = self.session.request(
                    method, url, headers=headers, data=body, stream=True, allow_redirects=redirects,
                    timeout=(min(self.timeouts.connect, remaining), min(self.timeouts.first_byte, remaining)),
                    auth=_Header(sent) if authorize else _Header(headers.get("Authorization") if headers else None))
            except _Deadline:
                raise RegistryUnreachable(f"{what}: no complete answer within {budget:g} s") from None
            except (requests.exceptions.RequestException, OSError) as exc:
                if isinstance(getattr(exc, "__context__", None), _Deadline):
                    raise RegistryUnreachable(f"{what}: no complete answer within {budget:g} s") from None
                failures += 1
                if failures >= attempts or isinstance(exc, requests.exceptions.InvalidURL):
                    raise RegistryUnreachable(f"{what}: {_reason(exc)}") from None
                time.sleep(min(0.5 * failures, max(0.0, deadline - time.monotonic())))
                continue
            finally:
                if isinstance(body, Body):
                    body.close()
            status = answer.status_code
            if status == 401 and authorize and not challenged:
                challenge = answer.headers.get("WWW-Authenticate", "")
                answer.close()
                if not challenge:
                    raise RegistryError(f"{what}: HTTP 401 without a challenge (WWW-Authenticate)", 401)
                self.auth.answer(challenge, scope, deadline, sent)
                challenged = True
                continue
            if status in RETRIED_STATUS and failures + 1 < attempts:
                failures += 1
                wait = _retry_after(answer.headers.get("Retry-After"), 0.5 * failures)
                answer.close()
                if time.monotonic() + wait >= deadline:
                    raise RegistryUnreachable(f"{what}: HTTP {status}, and no time left to try again within "
                                              f"{budget:g} s")
                time.sleep(wait)
                continue
            if status in expect:
                return answer
            raise self.refusal(answer, what)

    def refusal(self, answer: requests.Response, what: str) -> RegistryError:
        """The registry's error document (distribution spec "Error Codes": `errors`, each a
        `code` and a `message`) as one line; the answer is closed."""
        status = answer.status_code
        code = message = None
        try:
            text = self.read(answer, ERROR_LIMIT, time.monotonic() + self.timeouts.first_byte, what)
            errors = json.loads(text).get("errors") if text else None
            if isinstance(errors, list) and errors and isinstance(errors[0], dict):
                code = str(errors[0].get("code") or "")[:60] or None
                message = " ".join(str(errors[0].get("message") or "").split())[:200] or None
        except (RegistryError, ValueError, AttributeError):
            pass
        finally:
            answer.close()
        said = " ".join(p for p in (f"HTTP {status}", code, message and f"({message})") if p)
        if status == 401:
            said += f" (docker login {self.address.host}?)"
        return RegistryError(f"{what}: {said}", status, code)

    # --- answers -----------------------------------------------------------------------
    def pieces(self, answer: requests.Response, deadline: float, what: str) -> Iterator[bytes]:
        """The answer's body as it came (no content decoding: a digest covers the bytes
        sent), a piece at a time, each within the deadline."""
        try:
            for piece in answer.raw.stream(PIECE, decode_content=False):
                if time.monotonic() > deadline:
                    raise RegistryUnreachable(f"{what}: the answer did not end before its deadline")
                yield piece
        except self._requests.exceptions.RequestException as exc:
            raise RegistryUnreachable(f"{what}: {_reason(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - urllib3's own read errors (ProtocolError, ReadTimeoutError)
            if isinstance(exc, RegistryError):
                raise
            raise RegistryUnreachable(f"{what}: {_reason(exc)}") from None
        finally:
            answer.close()

    def read(self, answer: requests.Response, limit: int, deadline: float, what: str) -> bytes:
        """The whole body, when it is at most `limit` bytes (AnswerTooLarge otherwise, said
        by its Content-Length before a byte is read when the registry gives one)."""
        length = answer.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > limit:
            answer.close()
            raise AnswerTooLarge(f"{what}: {length} bytes, more than the {limit} expected")
        out = bytearray()
        for piece in self.pieces(answer, deadline, what):
            out += piece
            if len(out) > limit:
                answer.close()
                raise AnswerTooLarge(f"{what}: more than the {limit} bytes expected")
        return bytes(out)

    # --- the token realm ---------------------------------------------------------------
    def _realm_allowed(self, url: str) -> bool:
        parts = urlsplit(url)
        if parts.scheme == "https":
            return True
        realm_host = (parts.hostname or "").lower()
        # Plain HTTP only where the registry itself is spoken to in plain HTTP, and only to
        # its own host or this machine.
        return parts.scheme == "http" and self.plain and (
            realm_host == self.address.hostname.strip("[]").lower() or realm_host in ("localhost", "127.0.0.1", "::1"))

    def _realm(self, url: str, method: str, headers: dict[str, str], data: bytes | None,
               deadline: float) -> tuple[int, bytes]:
        answer = self._send(method, url, what=f"{self.address.host}: the token realm", scope="",
                            expect=(200, 400, 401, 403, 404), headers=headers, body=data, budget=None,
                            redirects=False, authorize=False, deadline=deadline)
        status = answer.status_code
        body = self.read(answer, 1 << 20, deadline, f"{self.address.host}: the token realm") if status == 200 else b""
        answer.close()
        return status, body


def _retry_after(value: str | None, default: float) -> float:
    if value and value.strip().isdigit():
        return min(float(value.strip()), 30.0)
    return default


def _reason(exc: BaseException) -> str:
    """A library's exception as words without a URL's query (an upload's `_state`) or a
    header: its type and the innermost reason."""
    inner: BaseException = exc
    while True:
        nested = getattr(inner, "reason", None) or (inner.args[0] if inner.args and isinstance(inner.args[0],
                                                                                           BaseException) else None)
        if not isinstance(nested, BaseException) or nested is inner:
            break
        inner = nested
    text = " ".join(str(inner).split())
    if "?" in text:
        text = text.split("?", 1)[0] + "?..."
    kind = "timed out" if "timeout" in type(exc).__name__.lower() or "timed out" in text.lower() else None
    return (kind + ": " if kind and kind not in text.lower() else "") + (text[:200] or type(exc).__name__)


__all__ = ["AnswerTooLarge", "Body", "Http", "RegistryAuthError", "RegistryError", "RegistryUnreachable"]
