"""Pure functions from a Pod object (a dict, as the API returns it) to what the node runs."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ddpjob_box.node.images import ImageRefused, entrypoint

# (kind "configMap" or "secret", name) -> its data, decoded; None when it does not exist.
ConfigLookup = Callable[[str, str], Mapping[str, str] | None]
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


@dataclass(frozen=True)
class Process:
    """One container, resolved: what to exec and with which environment."""

    container: str
    argv: tuple[str, ...]
    env: dict[str, str]
    working_dir: str | None


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names are replaced, unknown ones kept, $$ escapes a dollar."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REF.sub(one, text)


def field_value(pod: Mapping[str, Any], path: str) -> str:
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return str(meta.get(match.group(1), {}).get(match.group(2), ""))
    return ""


def _resource(container: Mapping[str, Any], ref: Mapping[str, Any], host_cpus: int) -> str:
    kind, _, name = str(ref.get("resource", "")).partition(".")
    value = container.get("resources", {}).get(kind, {}).get(name)
    if value is None:
        return str(host_cpus) if name == "cpu" else "0"
    return str(value)


def resolve_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], lookup: ConfigLookup, host_cpus: int
) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        for kind in ("configMap", "secret"):
            ref = source.get(f"{kind}Ref")
            if ref:
                for key, value in (lookup(kind, ref["name"]) or {}).items():
                    env[source.get("prefix", "") + key] = value
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        source = item.get("valueFrom", {})
        if "fieldRef" in source:
            env[name] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[name] = _resource(container, source["resourceFieldRef"], host_cpus)
        else:
            for kind in ("configMap", "secret"):
                ref = source.get(f"{kind}KeyRef")
                if ref:
                    found = (lookup(kind, ref["name"]) or {}).get(ref["key"])
                    if found is not None:
                        env[name] = found
        if name not in env:
            env[name] = ""
    return env


def process(
    pod: Mapping[str, Any], container: Mapping[str, Any], lookup: ConfigLookup, host_cpus: int
) -> Process | ImageRefused:
    image_entry = entrypoint(str(container.get("image", "")))
    if isinstance(image_entry, ImageRefused):
        return image_entry
    env = resolve_env(pod, container, lookup, host_cpus)
    command = container.get("command") or list(image_entry)
    args = container.get("args") or []
    argv = tuple(expand(str(part), env) for part in [*command, *args])
    return Process(container=container["name"], argv=argv, env=env, working_dir=container.get("workingDir"))


def dns_names(pod: Mapping[str, Any]) -> list[str]:
    """The names a cluster DNS would give this pod: ``<hostname>.<subdomain>`` with each search suffix."""
    meta, spec = pod["metadata"], pod.get("spec", {})
    hostname = spec.get("hostname") or meta["name"]
    subdomain = spec.get("subdomain")
    if not subdomain:
        return []
    base = f"{hostname}.{subdomain}"
    ns = meta["namespace"]
    return [base, f"{base}.{ns}", f"{base}.{ns}.svc", f"{base}.{ns}.svc.cluster.local"]


def own_names(pod: Mapping[str, Any]) -> list[str]:
    hostname = pod.get("spec", {}).get("hostname") or pod["metadata"]["name"]
    return [hostname, *dns_names(pod)]
