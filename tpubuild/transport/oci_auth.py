"""A registry's credentials found as docker and its tools find them, and its challenge
answered (transport/oci_http.py asks, on a 401).

Where credentials come from (docker/cli cli/config/configfile/file.go
`GetCredentialsStore`, credentials/native_store.go): the config file
`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`; for a registry host, the
credential helper `credHelpers` names for it, else the `credsStore` helper, else its
`auths` entry (`auth`: base64 of `user:password`, or `identitytoken`). A helper is the
program `docker-credential-<name>`, run as `get` with the registry's host on its
standard input, answering `{"Username": ..., "Secret": ...}` on its standard output
(docker/docker-credential-helpers client/client.go); a username of `<token>` means the
secret is an identity token (an OAuth2 refresh token).

The challenge (the distribution spec's and docker's token authentication, distribution
registry/auth/token/accesscontroller.go and docs/spec/auth/token.md): a 401 says
`WWW-Authenticate: Basic realm=...` (the credentials go with the request) or `Bearer
realm=URL,service=S,scope=repository:NAME:pull,push`, which asks for a token from the
realm: a GET with `service` and `scope` (Basic credentials when there are any), or, for
an identity token, a POST of `grant_type=refresh_token` (docs/spec/auth/oauth.md). The
token is kept per scope while the registry takes it.

Secrets never leave this module but as the Authorization header of a request to the
registry or its realm: no message quotes a secret, a helper's output, a token, or the
config file's contents (a parse error names the file and the line only).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from tpubuild.errors import TpubuildError

CONFIG_LIMIT = 1 << 20  # a docker config.json is kilobytes; a larger one is not read
HELPER_TIMEOUT = 30.0  # seconds a credential helper may take (a keychain may prompt)
TOKEN_LIMIT = 1 << 20
# docker's own name for Docker Hub's credentials (registry/config.go IndexServer).
DOCKER_HUB = "https://index.docker.io/v1/"
_HUB_HOSTS = {"docker.io", "index.docker.io", "registry-1.docker.io"}
_PARAM = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))')


class RegistryAuthError(TpubuildError):
    """Credentials that cannot be read or a challenge that cannot be answered: one line,
    never holding a secret."""

    exit_code = 1


@dataclass(frozen=True)
class Credentials:
    """A user and a password, or (`user` None) an identity token. `repr` shows no secret."""

    user: str | None
    secret: str

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r}, secret=<{len(self.secret)} characters>)"

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.user or ''}:{self.secret}".encode()).decode()


def config_path(environ: dict[str, str] | None = None) -> Path:
    """docker's config file: `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`."""
    environ = dict(os.environ) if environ is None else environ
    directory = environ.get("DOCKER_CONFIG")
    return Path(directory) / "config.json" if directory else Path.home() / ".docker" / "config.json"


def _host_key(key: str) -> str:
    """An `auths`/`credHelpers` key as the host it is for: docker writes `host[:port]`, and
    older clients `https://host/v1/` (registry/auth.go ConvertToHostname)."""
    if "://" in key:
        key = urlsplit(key).netloc or key
    return key.split("/", 1)[0]


def _read_config(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            data = handle.read(CONFIG_LIMIT + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise RegistryAuthError(f"{path}: cannot read it ({exc.strerror})") from None
    if len(data) > CONFIG_LIMIT:
        raise RegistryAuthError(f"{path}: larger than {CONFIG_LIMIT} bytes; not read")
    try:
        config = json.loads(data)
    except ValueError as exc:
        line = getattr(exc, "lineno", None)
        raise RegistryAuthError(f"{path}{f':{line}' if line else ''}: not JSON (docker's config file)") from None
    return config if isinstance(config, dict) else {}


def find_credentials(host: str, environ: dict[str, str] | None = None,
                     run: Callable[..., Any] = subprocess.run) -> Credentials | None:
    """The credentials docker would use for `host` (`name[:port]`), or None (anonymous)."""
    path = config_path(environ)
    config = _read_config(path)
    wanted = {host} | ({DOCKER_HUB, *_HUB_HOSTS} if host in _HUB_HOSTS else set())
    helpers: dict[str, Any] = config["credHelpers"] if isinstance(config.get("credHelpers"), dict) else {}
    helper = next((name for key, name in helpers.items() if _host_key(key) in wanted or key in wanted), None)
    if helper is None and isinstance(config.get("credsStore"), str) and config["credsStore"]:
        helper = config["credsStore"]
    if isinstance(helper, str) and helper:
        server = DOCKER_HUB if host in _HUB_HOSTS else host
        return _from_helper(helper, server, path, environ, run)
    auths: dict[str, Any] = config["auths"] if isinstance(config.get("auths"), dict) else {}
    entry = next((value for key, value in auths.items() if _host_key(key) in wanted or key in wanted), None)
    if not isinstance(entry, dict):
        return None
    token = entry.get("identitytoken")
    if isinstance(token, str) and token:
        return Credentials(None, token)
    encoded = entry.get("auth")
    if isinstance(encoded, str) and encoded:
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            sep = ""
        if not sep:
            raise RegistryAuthError(f"{path}: auths.{host}.auth is not base64 of user:password") from None
        return Credentials(user, password)
    return None


def _from_helper(helper: str, server: str, path: Path, environ: dict[str, str] | None,
                 run: Callable[..., Any]) -> Credentials | None:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", helper):
        raise RegistryAuthError(f"{path}: credential helper {helper[:60]!r} is not a helper's name")
    program = f"docker-credential-{helper}"
    try:
        done = run([program, "get"], input=server.encode(), capture_output=True, timeout=HELPER_TIMEOUT,
                   env=dict(os.environ) if environ is None else environ, check=False)
    except FileNotFoundError:
        raise RegistryAuthError(f"{path} names the credential helper {program}, which is not on PATH") from None
    except subprocess.TimeoutExpired:
        raise RegistryAuthError(f"{program} get {server}: no answer within {HELPER_TIMEOUT:g} s") from None
    if done.returncode != 0:
        # The helpers' "not found" answer (credentials/error.go errCredentialsNotFoundMessage):
        # anonymous, as docker pulls then. Any other failure is said without its output,
        # which may hold what the helper read.
        if b"credentials not found" in (done.stdout or b"") + (done.stderr or b""):
            return None
        raise RegistryAuthError(f"{program} get {server}: exit {done.returncode} (its output is not shown)")
    try:
        answer = json.loads(done.stdout)
        user, secret = answer.get("Username"), answer.get("Secret")
    except (ValueError, AttributeError):
        raise RegistryAuthError(f"{program} get {server}: its answer is not the helpers' JSON") from None
    if not isinstance(secret, str) or not isinstance(user, str):
        raise RegistryAuthError(f"{program} get {server}: its answer has no Username and Secret")
    if not secret:
        return None
    return Credentials(None if user == "<token>" else user, secret)


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="...",service="..."` as ("bearer", {"realm": ..., ...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {}
    for name, quoted, bare in _PARAM.findall(rest):
        params[name.lower()] = re.sub(r"\\(.)", r"\1", quoted) if quoted else bare
    return scheme.lower(), params


class Authorizer:
    """The Authorization header of a registry's requests: none until a 401 challenges, then
    Basic credentials or a token of the challenge's realm, kept per scope. `fetch(url,
    method, headers, form, deadline) -> (status, bytes)` asks the realm (oci_http.py's
    request, without authorization of its own); `realm_allowed(url)` says whether a realm
    URL may be sent credentials (https, or this registry's own plain-HTTP host)."""

    def __init__(self, host: str, fetch: Callable[..., tuple[int, bytes]], realm_allowed: Callable[[str], bool],
                 credentials: Callable[[], Credentials | None] | None = None):
        self.host = host
        self._fetch = fetch
        self._realm_allowed = realm_allowed
        self._credentials_of = credentials or (lambda: find_credentials(host))
        self._credentials: tuple[Credentials | None] | None = None
        self._headers: dict[str, str] = {}  # scope -> Authorization
        self._lock = threading.Lock()

    def credentials(self) -> Credentials | None:
        if self._credentials is None:
            self._credentials = (self._credentials_of(),)
        return self._credentials[0]

    def header(self, scope: str) -> str | None:
        with self._lock:
            return self._headers.get(scope) or self._headers.get("")

    def answer(self, challenge: str, scope: str, deadline: float, sent: str | None) -> str:
        """The Authorization header for `scope` after a 401 whose WWW-Authenticate was
        `challenge` (the refused request carried `sent`): Basic credentials, or a new token
        of the challenge's realm. The caller resends once: a second 401 is a refusal."""
        scheme, params = parse_challenge(challenge)
        with self._lock:
            kept = self._headers.get(scope) or self._headers.get("")
            if kept is not None and kept != sent:
                return kept  # another thread answered it meanwhile
            credentials = self.credentials()
            if scheme == "basic":
                if credentials is None or credentials.user is None:
                    raise RegistryAuthError(f"{self.host} asks for a user and a password, and docker's config has "
                                            f"none for it (docker login {self.host})")
                self._headers[""] = header = credentials.basic()
                return header
            if scheme != "bearer" or not params.get("realm"):
                raise RegistryAuthError(f"{self.host} asks for {scheme or 'an'} authentication, which tpubuild does "
                                        "not speak (Basic or Bearer)")
            token = self._token(params, scope, credentials, deadline)
            self._headers[scope] = header = f"Bearer {token}"
            return header

    def _token(self, params: dict[str, str], scope: str, credentials: Credentials | None, deadline: float) -> str:
        realm = params["realm"]
        if not self._realm_allowed(realm):
            raise RegistryAuthError(f"{self.host}: its token realm is not https (or this registry's own plain-HTTP "
                                    "host); no credentials sent there")
        from urllib.parse import urlencode

        query = [("service", params.get("service", ""))] if params.get("service") else []
        # The challenge's scope and the caller's (a mount also reads its source repository).
        wanted = list(dict.fromkeys([*params.get("scope", "").split(), *scope.split()]))
        scopes = [("scope", s) for s in wanted]
        headers = {}
        if credentials is not None and credentials.user is None:
            # An identity token: OAuth2's refresh grant (distribution docs/spec/auth/oauth.md).
            form = [("grant_type", "refresh_token"), ("refresh_token", credentials.secret),
                    ("client_id", "tpubuild"), *query, *scopes]
            status, body = self._fetch(realm, "POST", {"Content-Type": "application/x-www-form-urlencoded"},
                                       urlencode(form).encode(), deadline)
        else:
            if credentials is not None:
                headers["Authorization"] = credentials.basic()
            sep = "&" if "?" in realm else "?"
            status, body = self._fetch(f"{realm}{sep}{urlencode([*query, *scopes])}", "GET", headers, None, deadline)
        if status in (401, 403):
            why = "refused the credentials docker's config has" if credentials else "gives no anonymous token"
            raise RegistryAuthError(f"{self.host}: its token realm {why} (HTTP {status}; docker login {self.host})")
        if status != 200:
            raise RegistryAuthError(f"{self.host}: its token realm answered HTTP {status}")
        try:
            answer = json.loads(body)
            token = answer.get("token") or answer.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token or not re.fullmatch(r"[\x21-\x7e]+", token):
            raise RegistryAuthError(f"{self.host}: its token realm's answer holds no token")
        return token
