"""Unit tests of cohort_tools.envoy_config: the repository's Envoy configs adapted for N
replicas on given ports, as parsed YAML. Needs PyYAML (scripts/setup installs it into .venv)."""
import unittest

import yaml

from cohort_tools import envoy_config, stack

REPLICAS = [20001, 20002, 20003, 20004, 20005]


def clusters(doc):
    return {c["name"]: c for c in doc["static_resources"]["clusters"]}


def ports(node):
    return [a["port_value"] for a in envoy_config._socket_addresses(node)]


def routes(doc):
    return [r.get("name") for r in doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]]


class ConfigTests(unittest.TestCase):
    def test_assign_for_five_replicas(self):
        doc = envoy_config.config("assign", REPLICAS, 11001, 11002, ports={50051: 12001, 50052: 12001},
                                  filter_config='{"mode": "assign"}')
        self.assertEqual(ports(doc["admin"]), [11001])
        self.assertEqual(ports(doc["static_resources"]["listeners"]), [11002])
        by_name = clusters(doc)
        for i, port in enumerate(REPLICAS):
            self.assertEqual(ports(by_name[f"replica-{i}"]), [port])
            self.assertEqual(by_name[f"failover-replica-{i}"]["cluster_type"]["typed_config"]["clusters"][0],
                             {"name": f"replica-{i}"})
        self.assertNotIn("replica-5", by_name)
        self.assertEqual(ports(by_name["all-replicas"]), REPLICAS)
        self.assertEqual(ports(by_name["cohort-batcher-0"]), [12001])
        self.assertEqual(ports(by_name["cohort-batcher-1"]), [12001])
        self.assertEqual(routes(doc), [f"assigned-replica-{i}" for i in range(5)] + ["by-key"])
        text = envoy_config.dump(doc)
        self.assertIn(stack.FILTER, text)
        self.assertNotIn("8081", text)
        wasm = envoy_config.http_connection_manager(doc)["http_filters"][0]["typed_config"]["config"]
        self.assertEqual(wasm["configuration"]["value"], '{"mode": "assign"}')
        self.assertEqual(yaml.safe_load(text), doc)

    def test_batch_for_two_replicas(self):
        doc = envoy_config.config("batch", REPLICAS[:2], 11001, 11002, ports={50051: 12001, 8000: 12002})
        by_name = clusters(doc)
        self.assertEqual(sorted(n for n in by_name if n.startswith("replica-")), ["replica-0", "replica-1"])
        self.assertNotIn("failover-replica-2", by_name)
        self.assertEqual(routes(doc), ["batch-front-0", "assigned-replica-0", "assigned-replica-1", "by-key"])
        front = by_name["cohort-front-0"]["load_assignment"]["endpoints"]
        self.assertEqual(ports(front[0]), [12002])
        self.assertEqual(ports(front[1]), REPLICAS[:2])

    def test_served_by_and_round_robin(self):
        doc = envoy_config.config("round-robin", REPLICAS[:1], 11001, 11002)
        self.assertEqual(ports(clusters(doc)["engines"]), REPLICAS[:1])
        host = envoy_config.http_connection_manager(doc)["route_config"]["virtual_hosts"][0]
        self.assertEqual(host["response_headers_to_add"],
                         [{"header": {"key": "x-served-by", "value": "%UPSTREAM_REMOTE_ADDRESS%"}}])
        plain = envoy_config.config("round-robin", REPLICAS[:1], 11001, 11002, served_by=False)
        self.assertNotIn("response_headers_to_add", envoy_config.http_connection_manager(plain)["route_config"]
                         ["virtual_hosts"][0])

    def test_no_filter_configuration_to_replace(self):
        with self.assertRaises(SystemExit):
            envoy_config.config("round-robin", REPLICAS, 11001, 11002, filter_config="{}")

    def test_at_least_one_replica(self):
        with self.assertRaises(SystemExit):
            envoy_config.config("affinity", [], 11001, 11002)


if __name__ == "__main__":
    unittest.main()
