"""Debian's docker-registry (distribution 2.8, the reference registry) on a free port of
127.0.0.1 with filesystem storage under the test's tmp_path, started and stopped by its
pid; and the clients tpubuild does not contain that tests read it back with: raw HTTP
(urllib, the standard library), `skopeo`, oras-py.

A test that needs docker-registry or skopeo and does not find it fails in CI (CI=true:
.ci/run installs both) and is skipped elsewhere (`need`)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REGISTRY = "docker-registry"
ACCEPT = ("application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, "
          "application/vnd.docker.distribution.manifest.v2+json")


def need(program: str) -> str:
    """The path of `program`; without it, a failure in CI and a skip elsewhere."""
    found = shutil.which(program) or (f"/usr/bin/{program}" if os.path.exists(f"/usr/bin/{program}") else None)
    if found is None:
        message = f"{program} is not installed (apt-get install docker-registry skopeo; .ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Registry:
    """A running docker-registry: `host` (127.0.0.1:PORT), its storage, its process."""

    host: str
    root: Path
    process: subprocess.Popen
    auth: dict[str, str] = field(default_factory=dict)  # "user", "password" when it asks for them

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, repository: str = "models") -> str:
        return f"oci://{self.host}/{repository}"

    # --- raw HTTP, the test's own client --------------------------------------------
    def http(self, method: str, path: str, data: bytes | None = None, headers: dict | None = None,
             token: str | None = None) -> tuple[int, dict, bytes]:
        request = urllib.request.Request(f"http://{self.host}{path}", data=data, method=method,
                                         headers={**(headers or {})})
        if token:
            request.add_header("Authorization", token)
        elif self.auth:
            pair = f"{self.auth['user']}:{self.auth['password']}".encode()
            request.add_header("Authorization", "Basic " + base64.b64encode(pair).decode())
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, dict(answer.headers), answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def tags(self, repository: str) -> list[str]:
        status, _, body = self.http("GET", f"/v2/{repository}/tags/list")
        return json.loads(body).get("tags") or [] if status == 200 else []

    def manifest(self, repository: str, reference: str) -> tuple[bytes, str]:
        """(the manifest's bytes, the digest the registry says it has)."""
        status, headers, body = self.http("GET", f"/v2/{repository}/manifests/{reference}",
                                          headers={"Accept": ACCEPT})
        assert status == 200, (status, body)
        return body, headers.get("Docker-Content-Digest", "")

    def blob(self, repository: str, digest: str) -> bytes:
        status, _, body = self.http("GET", f"/v2/{repository}/blobs/{digest}")
        assert status == 200, (status, body)
        return body

    def push_blob(self, repository: str, data: bytes) -> str:
        """A monolithic upload (POST, then PUT with the bytes): the test's own pusher."""
        import hashlib

        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        status, headers, body = self.http("POST", f"/v2/{repository}/blobs/uploads/", b"")
        assert status == 202, (status, body)
        location = headers["Location"]
        location = location[location.index("/v2/"):] if "://" in location else location
        status, _, body = self.http("PUT", f"{location}&digest={digest}", data,
                                    {"Content-Type": "application/octet-stream"})
        assert status == 201, (status, body)
        return digest

    def put_manifest(self, repository: str, reference: str, data: bytes,
                     media_type: str = "application/vnd.oci.image.manifest.v1+json") -> str:
        status, headers, body = self.http("PUT", f"/v2/{repository}/manifests/{reference}", data,
                                          {"Content-Type": media_type})
        assert status == 201, (status, body)
        return headers["Docker-Content-Digest"]


def registry_config(root: Path, port: int, delete: bool = True, auth: dict | None = None) -> str:
    lines = [
        "version: 0.1",
        "log:",
        "  level: error",
        "  accesslog:",
        "    disabled: true",
        "storage:",
        "  filesystem:",
        f"    rootdirectory: {root / 'data'}",
        "  delete:",
        f"    enabled: {'true' if delete else 'false'}",
        "  maintenance:",
        "    uploadpurging:",
        "      enabled: false",
        "http:",
        f"  addr: 127.0.0.1:{port}",
        "  secret: tpubuild-tests",
    ]
    if auth:
        lines.append("auth:")
        for kind, options in auth.items():
            lines.append(f"  {kind}:")
            lines += [f"    {key}: {value}" for key, value in options.items()]
    return "\n".join(lines) + "\n"


def start_registry(root: Path, delete: bool = True, auth: dict | None = None) -> Registry:
    """docker-registry serving `root/data` on a free port (another port when the one picked
    was taken meanwhile), up when /v2/ answers."""
    program = need(REGISTRY)
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(5):
        port = free_port()
        (root / "config.yml").write_text(registry_config(root, port, delete, auth))
        log = open(root / "registry.log", "ab")
        process = subprocess.Popen([program, "serve", str(root / "config.yml")], stdout=log, stderr=log,
                                   stdin=subprocess.DEVNULL)
        log.close()
        registry = Registry(f"127.0.0.1:{port}", root, process)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return registry
            except OSError:
                time.sleep(0.05)
        stop_registry(registry)
    raise AssertionError(f"docker-registry did not start: {(root / 'registry.log').read_text()[-2000:]}")


def stop_registry(registry: Registry) -> None:
    """By its pid: SIGTERM, then SIGKILL when it has not ended in 5 s."""
    if registry.process.poll() is None:
        os.kill(registry.pid, signal.SIGTERM)
        try:
            registry.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(registry.pid, signal.SIGKILL)
            registry.process.wait(timeout=5)


def isolated_docker_config(directory: Path, config: dict | None = None) -> dict[str, str]:
    """An environment whose DOCKER_CONFIG is `directory` (config.json written from `config`):
    no credential of the machine's user is read."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or {}))
    return {"DOCKER_CONFIG": str(directory)}


def skopeo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """skopeo, its policy accepting anything (the registry is the test's own)."""
    program = need("skopeo")
    policy = Path(os.environ.get("TMPDIR", "/tmp")) / f"skopeo-policy-{os.getpid()}.json"
    if not policy.exists():
        policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    done = subprocess.run([program, "--policy", str(policy), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr
    return done


def oras_pull(host: str, reference: str, outdir: Path) -> list[str]:
    """oras-py's pull of `host/reference` into `outdir` (plain HTTP: the test's registry),
    each layer to its org.opencontainers.image.title: the files it wrote."""
    import oras.client

    client = oras.client.OrasClient(hostname=host, insecure=True)
    return client.pull(target=f"{host}/{reference}", outdir=str(outdir))


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every regular file below `root` by its relative path: what two trees are compared by."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- a registry that asks for a password: htpasswd, or a token server of the test's own --------------
def htpasswd(path: Path, user: str, password: str) -> Path:
    """An htpasswd file distribution reads (bcrypt only: registry/auth/htpasswd/htpasswd.go)."""
    import bcrypt

    path.write_bytes(user.encode() + b":" + bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4, prefix=b"2a"))
                     + b"\n")
    return path


class TokenServer:
    """docker's token authentication's realm (distribution docs/spec/auth/token.md), run by
    the test: GET /token?service=&scope= with Basic credentials answers a JWT (ES256, the
    signing certificate in its `x5c` header, which the registry checks against its
    rootcertbundle: registry/auth/token/token.go VerifySigningKey) granting every action
    asked for; wrong or no credentials, 401. `issued`: the scopes it granted."""

    SERVICE = "tpubuild-test-registry"
    ISSUER = "tpubuild-test-issuer"

    def __init__(self, root: Path, user: str, password: str):
        import datetime
        import http.server

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpubuild test token signer")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        root.mkdir(parents=True, exist_ok=True)
        self.bundle = root / "token-signer.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.der = self.cert.public_bytes(serialization.Encoding.DER)
        self.user, self.password = user, password
        self.issued: list[str] = []
        self.refused = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                from urllib.parse import parse_qs, urlsplit

                query = parse_qs(urlsplit(self.path).query)
                expected = "Basic " + base64.b64encode(f"{server.user}:{server.password}".encode()).decode()
                if self.headers.get("Authorization") != expected:
                    server.refused += 1
                    self.send_response(401)
                    self.end_headers()
                    return
                scopes = query.get("scope", [])
                server.issued += scopes
                body = json.dumps({"token": server.token(scopes), "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        import threading

        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}/token"

    def token(self, scopes: list[str]) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        access = []
        for scope in scopes:
            kind, name, actions = scope.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(self.der).decode()]}
        claims = {"iss": self.ISSUER, "sub": self.user, "aud": self.SERVICE, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": os.urandom(8).hex(), "access": access}
        signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing_input}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def registry_auth(self) -> dict:
        return {"token": {"realm": self.realm, "service": self.SERVICE, "issuer": self.ISSUER,
                          "rootcertbundle": str(self.bundle)}}

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join()
