"""TLS: `pyllamaopt serve --tls-cert/--tls-key` serves HTTPS and gRPC over TLS with one certificate
(self-signed here, made by the openssl command); the clients connect trusting it: pyllamaopt.client
(sync and asyncio, root_certificates), the openai client over https, the TypeScript SDK's fetch
(NODE_EXTRA_CA_CERTS). A client that does not trust the certificate, or speaks plaintext, is
refused; settings that cannot work stop the server before the model loads."""
from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from pyllamaopt import ServerError
from pyllamaopt.client import AsyncClient, Client
from pyllamaopt.serve import ServeSettings

from test_serve import LONG_PROMPT, Server, free_port, local_greedy, start_server, stop_server

ROOT = Path(__file__).resolve().parent.parent


def self_signed(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 and its key (PEM files), valid for two days."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make a test certificate (apt-get install openssl)")
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def tls_server(tiny_model_path, tmp_path_factory) -> Iterator[tuple[Server, str, Path]]:
    directory = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(directory)
    grpc_port = free_port()
    server = start_server(tiny_model_path, directory, "--grpc-port", str(grpc_port), "--tls-cert", str(cert),
                          "--tls-key", str(key), cafile=cert)
    yield server, f"127.0.0.1:{grpc_port}", cert
    stop_server(server)


def test_grpc_over_tls(tls_server, tiny_model):
    server, address, cert = tls_server
    with Client(address, root_certificates=cert, timeout=60) as client:  # a path
        with client.create_session(LONG_PROMPT) as session:
            assert [t.id for t in session.generate(6)] == local_greedy(tiny_model, LONG_PROMPT, 6)

    async def asynchronous() -> list[int]:
        async with AsyncClient(address, root_certificates=cert.read_bytes(), timeout=60) as c:  # PEM bytes
            return await c.tokenize("hello world")

    assert asyncio.run(asynchronous()) == tiny_model.tokenize("hello world", add_bos=False)


def test_untrusted_or_plaintext_grpc_clients_are_refused(tls_server):
    server, address, cert = tls_server
    other, _ = self_signed(cert.parent, "other")
    for client in (Client(address, timeout=10),                           # plaintext
                   Client(address, tls=True, timeout=10),                 # the system's roots only
                   Client(address, root_certificates=other, timeout=10)):  # another certificate
        with client, pytest.raises(ServerError) as e:
            client.create_session([1, 2, 3])
        assert e.value.code == "UNAVAILABLE"  # type: ignore[attr-defined]


def test_https(tls_server, tiny_model):
    server, _, cert = tls_server
    assert server.url.startswith("https://")
    status, body = server.request("POST", "/v1/sessions", {"tokens": LONG_PROMPT[:50]})
    assert status == 201
    status, out = server.request("POST", f"/v1/sessions/{body['session_id']}/generate", {"max_tokens": 4})
    assert status == 200 and out["tokens"] == local_greedy(tiny_model, LONG_PROMPT[:50], 4)
    client = server.client(http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=cert)))
    assert client.completions.create(model="m", prompt=LONG_PROMPT[:50], max_tokens=4).usage.completion_tokens == 4
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # not trusted without the certificate
        urllib.request.urlopen(server.url + "/health", timeout=30)
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plaintext to the TLS port
        urllib.request.urlopen(server.url.replace("https://", "http://") + "/health", timeout=30)


TYPESCRIPT_CLIENT = """
import { Client, ServerError } from "./src/index.js";
const client = new Client(process.argv[1]);
try {
  const session = await client.createSession({ tokens: await client.tokenize("hello world", { addBos: true }) });
  const text = await session.generateText({ maxTokens: 4 });
  await session.close();
  console.log(JSON.stringify({ ok: true, text }));
} catch (err) {
  console.log(JSON.stringify({ ok: false, error: err instanceof ServerError ? "ServerError" : String(err) }));
}
"""


@pytest.mark.parametrize("transport", ["https", "grpcs"])
def test_typescript_sdk_over_tls(tls_server, transport):
    """The TypeScript SDK over HTTPS (Node's fetch) and gRPC over TLS (Node's HTTP/2): a self-signed
    certificate is trusted with NODE_EXTRA_CA_CERTS, and refused without it."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: the TypeScript SDK needs Node 20+")
    server, address, cert = tls_server
    url = server.url if transport == "https" else f"grpcs://{address}"

    def run(env: dict[str, str]) -> str:
        done = subprocess.run([node, "--input-type=module", "-e", TYPESCRIPT_CLIENT, url],
                              cwd=ROOT / "sdks" / "typescript", capture_output=True, text=True, timeout=120,
                              env={**{k: v for k, v in os.environ.items() if k != "NODE_EXTRA_CA_CERTS"}, **env})
        assert done.returncode == 0, done.stderr
        return done.stdout

    trusted = run({"NODE_EXTRA_CA_CERTS": str(cert)})
    assert '"ok":true' in trusted, trusted
    assert run({}) == '{"ok":false,"error":"ServerError"}\n'  # "cannot reach": the certificate is not trusted


def test_tls_settings_are_checked(tmp_path):
    cert, key = self_signed(tmp_path)
    other_cert, other_key = self_signed(tmp_path, "other")
    ServeSettings(tls_cert=str(cert), tls_key=str(key)).check()
    with pytest.raises(SystemExit, match="both --tls-cert and --tls-key"):
        ServeSettings(tls_cert=str(cert)).check()
    with pytest.raises(SystemExit, match="cannot load them"):
        ServeSettings(tls_cert=str(cert), tls_key=str(other_key)).check()  # not this certificate's key
    with pytest.raises(SystemExit, match="cannot load them"):
        ServeSettings(tls_cert=str(tmp_path / "missing.pem"), tls_key=str(key)).check()
    with pytest.raises(SystemExit, match="cannot load them"):
        ServeSettings(tls_cert=str(key), tls_key=str(other_cert)).check()  # swapped files
    # the variables, as the command line reads them: refused before the model loads
    run = subprocess.run([sys.executable, "-m", "pyllamaopt.cli", "serve", "--model", str(tmp_path / "none.gguf")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "LLAMA_OPT_SERVE_TLS_CERT": str(cert)})
    assert run.returncode != 0 and "give both --tls-cert and --tls-key" in run.stderr, run.stderr
