"""`lepus ctl cluster_status`, `environment` and `report` beside rabbitmqctl 3.10.8: the same command
lines run against Lepus (lepus ctl) and the RabbitMQ reference node (rabbitmqctl), and both answers
are checked the same way: rabbitmqctl's JSON keys, sections and headings, filled with each node's
own figures."""

import json
import re

import pytest

from conftest import Lepus, free_port, lepus_binary, wait_for
from test_ctl import ctl_json, run

CLUSTER_STATUS_KEYS = ["alarms", "cluster_name", "disk_nodes", "feature_flags", "listeners", "maintenance_status",
                       "partitions", "ram_nodes", "running_nodes", "versions"]
CLUSTER_STATUS_SECTIONS = ["Basics", "Disk Nodes", "Running Nodes", "Versions", "Maintenance status", "Alarms",
                           "Network Partitions", "Listeners", "Feature flags"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def node_name(broker):
    return broker.get("/overview").json()["node"]


def test_cluster_status_json_has_rabbitmqctls_keys_and_this_node(lepus):
    status = ctl_json(lepus, "cluster_status")
    node = node_name(lepus)
    assert sorted(status) == CLUSTER_STATUS_KEYS
    assert status["disk_nodes"] == [node] and status["running_nodes"] == [node] and status["ram_nodes"] == []
    assert status["maintenance_status"] == {node: "not under maintenance"}
    assert status["alarms"] == [] and status["partitions"] == {}
    assert status["cluster_name"]
    listeners = status["listeners"][node]
    assert {"interface", "node", "port", "protocol", "purpose"} <= set(listeners[0])
    amqp = [listener for listener in listeners if listener["protocol"] == "amqp"]
    assert [listener["port"] for listener in amqp] == [lepus.amqp_port]
    http = [listener for listener in listeners if listener["protocol"] == "http"]
    assert [(listener["port"], listener["purpose"]) for listener in http] == [(lepus.http_port, "HTTP API")]
    assert status["versions"][node]["rabbitmq_version"]
    assert status["versions"][node]["rabbitmq_name"] == lepus.product_name()


def test_cluster_status_table_has_rabbitmqctls_sections(lepus):
    text = ANSI.sub("", run(lepus, "rabbitmqctl", "cluster_status").stdout)
    lines = text.splitlines()
    assert lines[0] == "Cluster status of node %s ..." % node_name(lepus)
    assert ANSI.sub("", run(lepus, "rabbitmqctl", "-q", "cluster_status").stdout).splitlines()[0] == "Basics"
    positions = [lines.index(section) for section in CLUSTER_STATUS_SECTIONS]
    assert positions == sorted(positions), lines
    node = node_name(lepus)
    assert "Node: %s, status: not under maintenance" % node in lines
    assert any(line.startswith("Node: %s, interface: " % node) and "port: %d, protocol: amqp" % lepus.amqp_port in line
               for line in lines), lines
    assert lines[lines.index("Alarms") + 2] == "(none)"
    # A node without a cluster port has no metadata group (nor has RabbitMQ's).
    assert "Metadata group" not in lines


@pytest.mark.lepus_only("a Lepus node with a cluster port; the cluster suite lists three nodes and a stopped one")
def test_cluster_status_of_a_clustered_node_names_its_cluster_and_metadata_leader(tmp_path):
    name = "diagnostics@localhost"
    node = Lepus(lepus_binary(), tmp_path / "data",
                 ["--node-name", name, "--cluster-port", str(free_port()), "--cluster-name", "diagnostics-cluster"])
    try:
        # A node with a cluster port and no seeds is a cluster of one once it has elected itself.
        assert wait_for(lambda: node.get("/lepus/cluster").json()["metadata"]["leader"] == name)
        status = ctl_json(node, "cluster_status")
        assert sorted(status) == CLUSTER_STATUS_KEYS
        assert status["cluster_name"] == "diagnostics-cluster"
        assert status["disk_nodes"] == [name] and status["running_nodes"] == [name]
        assert list(status["versions"]) == [name] and list(status["listeners"]) == [name]
        lines = run(node, "rabbitmqctl", "-q", "cluster_status").stdout.splitlines()
        assert "Cluster name: diagnostics-cluster" in lines
        metadata = lines[lines.index("Metadata group"):]
        assert "Leader: %s" % name in metadata and any(line.startswith("Term: ") for line in metadata), lines
    finally:
        node.stop()


def test_environment_names_the_nodes_settings(lepus):
    environment = ctl_json(lepus, "environment")
    # rabbitmqctl prints {APPLICATION: {KEY: VALUE}}: RabbitMQ's `rabbit`, Lepus's `lepus`.
    application = "lepus" if lepus.is_lepus else "rabbit"
    assert all(isinstance(settings, (dict, list)) for settings in environment.values())
    settings = environment[application]
    if lepus.is_lepus:
        assert settings["amqp_port"] == lepus.amqp_port and settings["http_port"] == lepus.http_port
        assert settings["sync"] == "always"
    else:
        assert settings["tcp_listeners"] == [lepus.amqp_port]
    table = run(lepus, "rabbitmqctl", "environment").stdout
    assert table.splitlines()[0] == "Application environment of node %s ..." % node_name(lepus)
    quiet = run(lepus, "rabbitmqctl", "-q", "environment").stdout
    assert quiet.startswith("[{") and ("{%s," % application) in quiet


def test_report_lists_the_sections_rabbitmqctl_lists(fresh_lepus, names):
    broker = fresh_lepus
    queue = names("report-q")
    assert broker.put("/queues/%2F/" + queue, {"durable": True}).status_code == 201
    node = node_name(broker)
    text = ANSI.sub("", run(broker, "rabbitmqctl", "report").stdout)
    lines = text.splitlines()
    headings = ["Reporting server status of node %s ..." % node, "Cluster status of node %s ..." % node,
                "Application environment of node %s ..." % node, "Listing connections ...", "Listing channels ...",
                "Listing queues for vhost / ...", "Listing exchanges for vhost / ...", "Listing bindings for vhost /...",
                'Listing permissions for vhost "/" ...', 'Listing policies for vhost "/" ...']
    missing = [heading for heading in headings if heading not in lines]
    assert not missing, (missing, text[:3000])
    positions = [lines.index(heading) for heading in headings]
    assert positions == sorted(positions)
    queues = lines[lines.index("Listing queues for vhost / ...") + 1:lines.index("Listing exchanges for vhost / ...")]
    assert queues[0].split("\t")[0] == "name" and any(line.split("\t")[0] == queue for line in queues[1:]), queues
    permissions = lines[lines.index('Listing permissions for vhost "/" ...') + 1]
    assert permissions.split("\t")[:4] == ["user", "configure", "write", "read"]


def test_report_as_json_holds_every_section_where_rabbitmqctl_refuses_it(fresh_lepus, names):
    broker = fresh_lepus
    if not broker.is_lepus:
        refused = run(broker, "rabbitmqctl", "report", "--formatter", "json", expect=None)
        assert refused.returncode != 0 and "Only report formatter is supported" in refused.stdout + refused.stderr, refused
        return
    queue = names("report-json")
    assert broker.put("/queues/%2F/" + queue, {"durable": True}).status_code == 201
    report = json.loads(run(broker, "rabbitmqctl", "report", "--formatter", "json").stdout)
    assert sorted(report) == ["channels", "cluster_status", "connections", "environment", "status", "vhosts"]
    assert sorted(report["cluster_status"]) == CLUSTER_STATUS_KEYS
    assert report["environment"]["lepus"]["amqp_port"] == broker.amqp_port
    assert sorted(report["vhosts"]["/"]) == ["bindings", "exchanges", "permissions", "policies", "queues"]
    assert queue in [row["name"] for row in report["vhosts"]["/"]["queues"]]
    assert report["status"]["node"] == node_name(broker)
