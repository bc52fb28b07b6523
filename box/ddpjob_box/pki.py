"""Keys and certificates for the control plane, made with the openssl command."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ddpjob_box.errors import BoxError


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise BoxError("openssl is missing: run 'apt-get install -y openssl'")
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BoxError(f"openssl {args[0]} failed in {cwd}: {proc.stderr.strip().splitlines()[-1:]}")


def make_pki(directory: Path, ips: Sequence[str], dns: Sequence[str]) -> None:
    """Write ca.{crt,key}, the serving cert apiserver.{crt,key} and the service-account keys sa.{key,pub}."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=directory)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-days",
        "30",
        "-subj",
        "/CN=ddpjob-box-ca",
        "-out",
        "ca.crt",
        cwd=directory,
    )
    san = ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{name}" for name in dns)])
    (directory / "san.cnf").write_text(
        "[ext]\nsubjectAltName=" + san + "\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
    )
    _openssl("genrsa", "-out", "apiserver.key", "2048", cwd=directory)
    _openssl(
        "req",
        "-new",
        "-key",
        "apiserver.key",
        "-subj",
        "/CN=kube-apiserver",
        "-out",
        "apiserver.csr",
        cwd=directory,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "apiserver.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        "san.cnf",
        "-extensions",
        "ext",
        "-out",
        "apiserver.crt",
        cwd=directory,
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
