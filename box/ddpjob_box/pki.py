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
    """Write ca.{crt,key}, the serving cert apiserver.{crt,key}, the client certs apiserver-kubelet-client.{crt,key}
    (the apiserver's identity towards kubelets, for logs and exec) and front-proxy-client.{crt,key} (towards
    aggregated APIs, such as Kueue's visibility API), and the service-account keys sa.{key,pub}."""
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
    issue_cert(directory, "apiserver", "/CN=kube-apiserver", server=True, ips=ips, dns=dns)
    kubelet_client = "/O=system:masters/CN=kube-apiserver-kubelet-client"
    issue_cert(directory, "apiserver-kubelet-client", kubelet_client, server=False)
    issue_cert(directory, "front-proxy-client", "/CN=front-proxy-client", server=False)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)


def issue_cert(
    directory: Path,
    name: str,
    subject: str,
    *,
    server: bool,
    ips: Sequence[str] = (),
    dns: Sequence[str] = (),
) -> None:
    """Write ``name.{crt,key}``, signed by the CA in ``directory``: a serving cert naming ``ips`` and ``dns``,
    or a client cert whose subject carries the user (CN) and its groups (O), as the apiserver reads them."""
    lines = ["[ext]", "keyUsage=digitalSignature,keyEncipherment"]
    lines.append(f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}")
    san = ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{host}" for host in dns)])
    if san:
        lines.append(f"subjectAltName={san}")
    (directory / f"{name}.cnf").write_text("\n".join(lines) + "\n")
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=directory)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=directory)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        f"{name}.cnf",
        "-extensions",
        "ext",
        "-out",
        f"{name}.crt",
        cwd=directory,
    )
