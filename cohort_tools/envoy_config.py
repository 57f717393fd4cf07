"""The repository's Envoy configs (istio/envoy/*.yaml) adapted for a run on loopback: parsed
with PyYAML, changed as data, written back and started.

A config is written for three engine replicas on the default ports 8081-8083; `config()` makes
it one for N replicas on given ports: every endpoint list of the three becomes a list of N, the
per-replica routes (`assigned-replica-K`) and clusters (`replica-K`, `failover-replica-K`) are
repeated for replicas 3 and up (fewer than three replicas: the extra ones are dropped). It also
points admin and the listener at given ports, maps other default ports (the batcher's gRPC
50051, its front 8000) to the ports a run started them on, uses the built filter's absolute
path, and can replace the filter's configuration. `start()` does that with free ports and
starts Envoy (tests/src/config.rs does the same for the Rust tests).

    from cohort_tools import envoy_config
    proc, admin, listen = envoy_config.start("round-robin", workdir, replica_ports)
"""
import copy
import os
import re

import yaml

from cohort_tools import stack

# The default engine ports in istio/envoy/*.yaml, in replica order.
DEFAULT_REPLICA_PORTS = (8081, 8082, 8083)
# The per-replica list items (routes and clusters), by the prefix of their name.
PER_REPLICA = ("assigned-replica-", "failover-replica-", "replica-")
HTTP_CONNECTION_MANAGER = ("type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                           ".HttpConnectionManager")
DEFAULT_FILTER = "target/wasm/cohort_filter.wasm"


def load(name):
    """istio/envoy/<name>.yaml, parsed."""
    with open(os.path.join(stack.ROOT, "istio/envoy", name + ".yaml")) as f:
        return yaml.safe_load(f)


def dump(doc):
    """A config as YAML text, keys in their order."""
    return yaml.safe_dump(doc, sort_keys=False, width=1 << 16)


def _walk(node):
    """Every dict and list in `node`, depth first, in document order."""
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        if isinstance(child, (dict, list)):
            yield from _walk(child)


def _socket_addresses(node):
    return [d["socket_address"] for d in _walk(node)
            if isinstance(d, dict) and isinstance(d.get("socket_address"), dict)]


def _lb_endpoint_port(item):
    """The port of one `lb_endpoints` item, None when it has none."""
    try:
        return item["endpoint"]["address"]["socket_address"]["port_value"]
    except (KeyError, TypeError):
        return None


def _rename(node, old, new):
    """A deep copy of `node` with `old` replaced by `new` in every string value."""
    if isinstance(node, dict):
        return {k: _rename(v, old, new) for k, v in node.items()}
    if isinstance(node, list):
        return [_rename(v, old, new) for v in node]
    return node.replace(old, new) if isinstance(node, str) else node


def _block_lists(doc):
    """The lists of named routes and clusters: every virtual host's routes, and the clusters."""
    routes = [node["routes"] for node in _walk(doc) if isinstance(node, dict) and "domains" in node
              and isinstance(node.get("routes"), list)]
    return routes + [doc["static_resources"]["clusters"]]


def expand_replicas(doc, replica_ports):
    """Makes a config written for the three default engine ports one for `replica_ports`: every
    endpoint list of the three becomes one endpoint per replica; the per-replica routes and
    clusters of replica 2 are repeated for replicas 3 and up (fewer than three replicas: the
    extra ones are removed), and each cluster `replica-K` points at replica K's port."""
    count = len(replica_ports)
    if count < 1:
        raise SystemExit("envoy_config: at least one replica")
    # 1. Lists of all three endpoints: one endpoint per replica.
    for node in list(_walk(doc)):
        if isinstance(node, dict) and isinstance(node.get("lb_endpoints"), list):
            items = node["lb_endpoints"]
            if tuple(_lb_endpoint_port(item) for item in items) == DEFAULT_REPLICA_PORTS:
                node["lb_endpoints"] = []
                for port in replica_ports:
                    item = copy.deepcopy(items[0])
                    item["endpoint"]["address"]["socket_address"]["port_value"] = port
                    node["lb_endpoints"].append(item)
    # 2. The routes and clusters that belong to one replica: replica 2's repeated or removed.
    for kind in PER_REPLICA:
        for items in _block_lists(doc):
            at = next((i for i, item in enumerate(items) if isinstance(item, dict) and item.get("name") == f"{kind}2"),
                      None)
            if at is None:
                continue
            items[at + 1:at + 1] = [_rename(items[at], "replica-2", f"replica-{k}") for k in range(3, count)]
            items[:] = [item for item in items if not (isinstance(item, dict) and item.get("name") in
                                                       {f"{kind}{k}" for k in range(count, 3)})]
    # 3. Each per-replica cluster's endpoint: its replica's port.
    for item in doc["static_resources"]["clusters"]:
        match = re.fullmatch(r"replica-(\d+)", str(item.get("name", "")))
        if match:
            for address in _socket_addresses(item):
                if address.get("port_value") in DEFAULT_REPLICA_PORTS:
                    address["port_value"] = replica_ports[int(match.group(1))]
    return doc


def http_connection_manager(doc):
    """The (first) listener's HTTP connection manager configuration."""
    return next(d for d in _walk(doc) if isinstance(d, dict) and d.get("@type") == HTTP_CONNECTION_MANAGER)


def config(name, replica_ports, admin, listen, ports=None, filter_config=None, served_by=True, wasm=None):
    """istio/envoy/<name>.yaml (parsed) with admin on `admin` and the listener on `listen`,
    its replicas on `replica_ports` (expand_replicas), other ports replaced as `ports` maps
    them ({50051: grpc, 8000: front}), the filter module `wasm` (default: the built filter,
    absolute), and optionally another filter configuration (JSON text). With `served_by`,
    responses carry `x-served-by: <upstream address>`."""
    doc = load(name)
    doc["admin"]["address"]["socket_address"]["port_value"] = admin
    for listener in doc["static_resources"]["listeners"]:
        listener["address"]["socket_address"]["port_value"] = listen
    for address in _socket_addresses(doc["static_resources"]["clusters"]):
        if address.get("port_value") in (ports or {}):
            address["port_value"] = ports[address["port_value"]]
    expand_replicas(doc, replica_ports)
    for node in _walk(doc):
        if isinstance(node, dict) and node.get("filename") == DEFAULT_FILTER:
            node["filename"] = wasm or stack.FILTER
    if filter_config is not None:
        plugin = next((d["configuration"] for d in _walk(doc) if isinstance(d, dict)
                       and isinstance(d.get("configuration"), dict) and "value" in d["configuration"]), None)
        if plugin is None:
            raise SystemExit(f"istio/envoy/{name}.yaml: no filter configuration to replace")
        plugin["value"] = filter_config
    if served_by:
        # Tell the client which upstream answered (for per-replica tables).
        for node in _walk(doc):
            if isinstance(node, dict) and node.get("domains") == ["*"]:
                node.setdefault("response_headers_to_add", []).append(
                    {"header": {"key": "x-served-by", "value": "%UPSTREAM_REMOTE_ADDRESS%"}})
    return doc


def start(name, workdir, replica_ports, label=None, edit=None, workers=None, **options):
    """Envoy on istio/envoy/<name>.yaml made by config(…, **options) for free admin and
    listener ports (again on others while one is taken), written to `workdir/<label>.yaml`
    (default label: `<name>-envoy`; the log: `<label>.log`). `edit(doc)` may change the parsed
    config further. Returns (proc, admin, listen)."""
    def make(admin, listen):
        doc = config(name, replica_ports, admin, listen, **options)
        if edit:
            edit(doc)
        return dump(doc)

    return stack.start_envoy_on_free_ports(workdir, label or f"{name}-envoy", make, workers=workers)
