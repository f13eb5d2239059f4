"""examples/k8s: every manifest has what Kubernetes requires, and the NPD plugin config what
node-problem-detector validates and needs, wired to the DaemonSet's mounts."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_gpuhost.reports.npd import MAX_MESSAGE

from ..conftest import REPO

K8S = REPO / "examples" / "k8s"
NPD_BUFFER = 4096
"""NPD keeps at most 4 KiB of a plugin's stdout (maxCustomPluginBufferBytes)."""
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(text: str) -> float:
    """Seconds of a Go time.ParseDuration string (NPD's format: "300s", "1m30s")."""
    parts = _DURATION.findall(text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a Go duration: {text!r}"
    return sum(float(n) * _UNITS[u] for n, u in parts)


def manifests() -> list[dict[str, Any]]:
    docs = [doc for path in sorted(K8S.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert docs, "no manifests under examples/k8s"
    return docs


def one(kind: str) -> dict[str, Any]:
    found = [doc for doc in manifests() if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def monitor() -> dict[str, Any]:
    config: dict[str, Any] = json.loads((K8S / "gpuhost-monitor.json").read_text())
    return config


def container() -> dict[str, Any]:
    containers = one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    found: dict[str, Any] = containers[0]
    return found


@pytest.mark.parametrize("doc", manifests(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_manifest_has_api_version_kind_and_name(doc: dict[str, Any]) -> None:
    assert re.fullmatch(r"([a-z0-9.]+/)?v\d+(beta\d+|alpha\d+)?", doc["apiVersion"])
    assert doc["kind"][:1].isupper()
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", doc["metadata"]["name"])


def test_daemonset_selector_matches_its_pod_labels() -> None:
    ds = one("DaemonSet")
    assert ds["apiVersion"] == "apps/v1"
    selector = ds["spec"]["selector"]["matchLabels"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert selector and selector.items() <= labels.items()


def test_every_volume_mount_names_a_declared_volume() -> None:
    volumes = {v["name"]: v for v in one("DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    assert len(volumes) == len(one("DaemonSet")["spec"]["template"]["spec"]["volumes"])
    mounts = container()["volumeMounts"]
    assert {m["name"] for m in mounts} <= volumes.keys()
    assert len({m["mountPath"] for m in mounts}) == len(mounts)


def test_the_host_is_mounted_read_only_under_the_gpuhost_root() -> None:
    pod = one("DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {volumes[m["name"]].get("hostPath", {}).get("path"): m
              for m in container()["volumeMounts"]}
    root = args_of_rule()["--gpuhost-root"]
    for host_path in ("/proc", "/sys", "/dev/kmsg"):
        assert host_path in mounts, f"host {host_path} is not mounted"
        assert mounts[host_path]["readOnly"] is True
        assert mounts[host_path]["mountPath"] == root + host_path
    assert container()["securityContext"]["privileged"] is True
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in \
        container()["env"]


def test_the_service_account_is_bound_to_npds_role() -> None:
    account = one("ServiceAccount")["metadata"]
    binding = one("ClusterRoleBinding")
    assert one("DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]
    assert {"kind": "ServiceAccount", "name": account["name"],
            "namespace": account["namespace"]} in binding["subjects"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "system:node-problem-detector"}


def test_npd_loads_the_monitor_config_from_the_config_map() -> None:
    pod = one("DaemonSet")["spec"]["template"]["spec"]
    flag = "--config.custom-plugin-monitor="
    paths = [a[len(flag):] for a in container()["command"] if a.startswith(flag)]
    assert len(paths) == 1
    config_volume = next(v for v in pod["volumes"] if "configMap" in v)
    mount = next(m for m in container()["volumeMounts"] if m["name"] == config_volume["name"])
    items = {i["path"] for i in config_volume["configMap"]["items"]}
    assert paths[0] == f"{mount['mountPath']}/gpuhost-monitor.json"
    assert f"{mount['mountPath']}/{Path(args_of_rule()['--gpuhost-spec']).name}" == \
        args_of_rule()["--gpuhost-spec"]
    assert {"gpuhost-monitor.json", Path(args_of_rule()["--gpuhost-spec"]).name} <= items
    assert "--from-file=examples/k8s/gpuhost-monitor.json" in (K8S / "gpuhost-npd.yaml").read_text()


def test_the_plugin_config_has_every_field_npd_reads() -> None:
    config = monitor()
    assert config["plugin"] == "custom"  # the only plugin NPD supports
    assert config["source"]
    plugin = config["pluginConfig"]
    assert set(plugin) >= {"invoke_interval", "timeout", "max_output_length", "concurrency",
                           "enable_message_change_based_condition_update"}
    assert isinstance(plugin["concurrency"], int) and plugin["concurrency"] >= 1
    assert isinstance(plugin["enable_message_change_based_condition_update"], bool)
    conditions = {c["type"] for c in config["conditions"]}
    for condition in config["conditions"]:
        assert condition["reason"] and condition["message"]
    for rule in config["rules"]:
        assert rule["type"] in ("temporary", "permanent")
        assert rule["reason"] and rule["path"].startswith("/")
        if rule["type"] == "permanent":  # NPD refuses a permanent rule without its condition
            assert rule["condition"] in conditions
        assert isinstance(rule["args"], list) and all(isinstance(a, str) for a in rule["args"])


def test_timeouts_and_output_length_are_within_npds_limits() -> None:
    plugin = monitor()["pluginConfig"]
    interval, timeout = go_duration(plugin["invoke_interval"]), go_duration(plugin["timeout"])
    assert 0 < timeout < interval  # a run ends before the next one starts
    for rule in monitor()["rules"]:
        assert 0 < go_duration(rule["timeout"]) <= timeout  # NPD's Validate() refuses more
    assert MAX_MESSAGE <= plugin["max_output_length"] <= NPD_BUFFER


def args_of_rule() -> dict[str, str]:
    """The gpuhost rule's --name=value arguments (and the bare flags, as '')."""
    (rule,) = monitor()["rules"]
    args: list[str] = rule["args"]
    assert "--gpuhost-npd" in args
    assert args[args.index("-m") + 1] == "not gpuhost_slow"  # the fast subset
    assert "--fix" not in args  # NPD verifies; it never changes the host
    return {a.split("=", 1)[0]: a.split("=", 1)[1] if "=" in a else "" for a in args}


def test_the_plugin_path_is_what_the_image_installs() -> None:
    (rule,) = monitor()["rules"]
    dockerfile = (K8S / "Dockerfile").read_text()
    venv = str(Path(rule["path"]).parent.parent)
    assert f"python3 -m venv {venv}" in dockerfile
    entrypoint = dockerfile.rstrip().splitlines()[-1].removeprefix("ENTRYPOINT ")
    assert json.loads(entrypoint) == [container()["command"][0]]


def test_the_monitors_runs_keep_their_spec_in_a_cache_directory_the_image_makes_roots() -> None:
    """pytest's cache on, in a directory of the image that no other user can write (the spec
    cache trusts no other): each run after the first loads the spec the one before parsed."""
    (rule,) = monitor()["rules"]
    args: list[str] = rule["args"]
    assert "no:cacheprovider" not in args
    [cache_dir] = [value.removeprefix("cache_dir=") for flag, value in itertools.pairwise(args)
                   if flag == "-o" and value.startswith("cache_dir=")]
    assert cache_dir.startswith("/") and not cache_dir.startswith(
        tuple(m["mountPath"] for m in container()["volumeMounts"]))  # the image's, not a volume
    assert f"install -d -m 0700 {cache_dir}" in (K8S / "Dockerfile").read_text()


def test_the_feature_file_goes_to_the_hosts_nfd_features_directory() -> None:
    volumes = {v["name"]: v for v in one("DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    nfd = args_of_rule()["--gpuhost-nfd"]
    mount = next(m for m in container()["volumeMounts"] if nfd.startswith(m["mountPath"] + "/"))
    assert volumes[mount["name"]]["hostPath"]["path"] == \
        "/etc/kubernetes/node-feature-discovery/features.d"
    assert "readOnly" not in mount  # the one place it writes
