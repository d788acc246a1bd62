"""Three real `lepus server` processes: formation, membership, definitions replicated through
the metadata Raft group, and failures (kill -9, restart, a minority, a stray client)."""

import json
import os
import signal
import socket
import subprocess
import time

import pika
import pytest
import requests

from cluster_harness import LEPUS_BIN, Node, eventually, free_port


def test_three_seeds_form_one_cluster_and_every_node_lists_every_node(cluster):
    statuses = [node.status() for node in cluster.nodes]
    assert len({status["cluster_id"] for status in statuses}) == 1, statuses
    assert len({status["metadata"]["leader"] for status in statuses}) == 1, statuses
    names = sorted(node.name for node in cluster.nodes)
    for node in cluster.nodes:
        listed = node.get("/nodes").json()
        assert sorted(entry["name"] for entry in listed) == names
        assert all(entry["running"] for entry in listed), listed
        assert node.get(f"/nodes/{cluster.nodes[0].name}").json()["running"] is True
    output = subprocess.run([LEPUS_BIN, "ctl", "--url", f"http://127.0.0.1:{cluster.nodes[1].http_port}", "cluster_status"],
                            capture_output=True, text=True, timeout=30)
    assert output.returncode == 0, output.stderr
    running = output.stdout.split("Running Nodes")[1]
    assert all(name in running for name in names), output.stdout
    # rabbitmqctl's JSON shape, with every member in it.
    shaped = cluster_status_json(cluster.nodes[2])
    assert shaped["disk_nodes"] == names and shaped["running_nodes"] == names, shaped


def cluster_status_json(node):
    output = subprocess.run([LEPUS_BIN, "ctl", "--url", f"http://127.0.0.1:{node.http_port}", "cluster_status", "--formatter", "json"],
                            capture_output=True, text=True, timeout=30)
    assert output.returncode == 0, output.stderr
    return json.loads(output.stdout)


def test_definitions_made_on_any_node_are_on_every_node(cluster):
    first, second, third = cluster.nodes
    connection = pika.BlockingConnection(pika.URLParameters(first.url()))
    channel = connection.channel()
    channel.exchange_declare("cluster.x", "topic", durable=True)
    channel.queue_declare("cluster.q", durable=True, arguments={"x-max-length": 10})
    channel.queue_bind("cluster.q", "cluster.x", routing_key="a.#")
    connection.close()
    assert second.put("/vhosts/cluster-vhost").status_code == 201
    assert third.put("/users/cluster-user", {"password": "secret", "tags": ""}).status_code == 201
    assert third.put("/permissions/cluster-vhost/cluster-user", {"configure": ".*", "write": ".*", "read": ".*"}).status_code == 201
    assert second.put("/policies/%2F/cluster-policy", {"pattern": "^cluster\\.", "definition": {"max-length": 5}, "apply-to": "queues"}).status_code == 201
    for node in cluster.nodes:
        def replicated(node=node):
            queue = node.get("/queues/%2F/cluster.q").json()
            bindings = node.get("/queues/%2F/cluster.q/bindings").json()
            return (queue["arguments"] == {"x-max-length": 10} and queue["policy"] == "cluster-policy"
                    and node.get("/exchanges/%2F/cluster.x").json()["type"] == "topic"
                    and any(binding["source"] == "cluster.x" and binding["routing_key"] == "a.#" for binding in bindings)
                    and node.get("/vhosts/cluster-vhost").ok
                    and node.get("/permissions/cluster-vhost/cluster-user").ok)
        eventually(replicated, what=f"the definitions on {node.name}")
        # The replicated user logs in on every node, into the replicated vhost.
        connection = pika.BlockingConnection(pika.URLParameters(f"amqp://cluster-user:secret@127.0.0.1:{node.amqp_port}/cluster-vhost"))
        connection.close()
    # A passive declare through another node finds the queue; a different redeclare is refused there too.
    channel = pika.BlockingConnection(pika.URLParameters(third.url())).channel()
    channel.queue_declare("cluster.q", passive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.queue_declare("cluster.q", durable=False)
    assert refused.value.reply_code == 406


def test_a_classic_queue_is_served_by_its_own_node_and_refused_clearly_elsewhere(cluster):
    first, second, _ = cluster.nodes
    home = pika.BlockingConnection(pika.URLParameters(first.url()))
    channel = home.channel()
    channel.confirm_delivery()
    channel.queue_declare("cluster.classic", durable=True)
    channel.basic_publish("", "cluster.classic", b"on its node", pika.BasicProperties(delivery_mode=2))
    eventually(lambda: second.get("/queues/%2F/cluster.classic").ok, what="the queue's definition on the second node")
    # 540 NOT_IMPLEMENTED is a connection error in AMQP 0-9-1: each refusal closes its connection.
    other = pika.BlockingConnection(pika.URLParameters(second.url()))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as error:
        other.channel().basic_get("cluster.classic")
    assert error.value.reply_code == 540 and first.name in error.value.reply_text, error.value.reply_text
    other = pika.BlockingConnection(pika.URLParameters(second.url()))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as error:
        other.channel().basic_consume("cluster.classic", lambda *arguments: None)
        other.process_data_events(time_limit=1)
    assert error.value.reply_code == 540
    other = pika.BlockingConnection(pika.URLParameters(second.url()))
    publisher = other.channel()
    publisher.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        publisher.basic_publish("", "cluster.classic", b"through another node", pika.BasicProperties(delivery_mode=2))
    other.close()
    method, _, body = channel.basic_get("cluster.classic", auto_ack=True)
    assert body == b"on its node"
    assert channel.basic_get("cluster.classic")[0] is None, "the nacked message must not be in the queue"
    home.close()


def test_exclusive_queue_of_another_nodes_connection_is_locked_and_goes_with_it(cluster):
    first, second, _ = cluster.nodes
    owner = pika.BlockingConnection(pika.URLParameters(first.url()))
    owner.channel().queue_declare("cluster.exclusive", exclusive=True)
    eventually(lambda: second.get("/queues/%2F/cluster.exclusive").ok, what="the exclusive queue listed on the second node")
    channel = pika.BlockingConnection(pika.URLParameters(second.url())).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
        channel.queue_declare("cluster.exclusive", exclusive=True)
    assert error.value.reply_code == 405
    owner.close()
    eventually(lambda: second.get("/queues/%2F/cluster.exclusive").status_code == 404, what="the exclusive queue gone on every node")


def test_the_leader_killed_then_restarted_catches_up_and_keeps_its_classic_messages(cluster):
    leader = cluster.leader()
    survivors = [node for node in cluster.nodes if node is not leader]
    connection = pika.BlockingConnection(pika.URLParameters(leader.url()))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("cluster.kept", durable=True)
    for index in range(20):
        channel.basic_publish("", "cluster.kept", f"m{index}".encode(), pika.BasicProperties(delivery_mode=2))
    leader.kill(signal.SIGKILL)
    # A new leader within a few election timeouts, and definitions change through the survivors.
    started = time.time()
    eventually(lambda: survivors[0].status()["metadata"]["leader"] in {node.name for node in survivors}, timeout=10, what="a new leader")
    elected_s = time.time() - started
    assert survivors[0].put("/vhosts/made-while-down").status_code == 201
    channel = pika.BlockingConnection(pika.URLParameters(survivors[1].url())).channel()
    channel.queue_declare("cluster.made-while-down", durable=True)
    assert [entry["running"] for entry in survivors[0].get("/nodes").json() if entry["name"] == leader.name] == [False]
    shaped = cluster_status_json(survivors[0])
    assert leader.name in shaped["disk_nodes"] and leader.name not in shaped["running_nodes"], shaped
    assert sorted(shaped["running_nodes"]) == sorted(node.name for node in survivors), shaped
    leader.start()
    leader.wait_listening()
    cluster.wait_formed()
    eventually(lambda: leader.get("/vhosts/made-while-down").ok and leader.get("/queues/%2F/cluster.made-while-down").ok,
               what="the restarted node's catch-up")
    assert leader.get("/queues/%2F/cluster.kept").json()["messages"] == 20
    channel = pika.BlockingConnection(pika.URLParameters(leader.url())).channel()
    bodies = [channel.basic_get("cluster.kept", auto_ack=True)[2] for _ in range(20)]
    assert bodies == [f"m{index}".encode() for index in range(20)]
    print(f"new metadata leader elected {elected_s:.2f} s after the kill")


def test_a_minority_cannot_change_definitions_and_says_so(cluster):
    first, second, third = cluster.nodes
    second.kill(signal.SIGKILL)
    third.kill(signal.SIGKILL)
    channel = pika.BlockingConnection(pika.URLParameters(first.url())).channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as error:
        channel.queue_declare("cluster.no-majority", durable=True)
    assert error.value.reply_code == 541 and "majority" in error.value.reply_text
    second.start()
    second.wait_listening()
    eventually(lambda: first.put("/vhosts/majority-back").status_code == 201, timeout=30, what="a change once a majority is back")
    assert second.get("/vhosts/majority-back").ok


def test_a_paused_follower_does_not_stop_the_others(cluster):
    leader = cluster.leader()
    follower = next(node for node in cluster.nodes if node is not leader)
    follower.kill(signal.SIGSTOP)
    try:
        assert leader.put("/vhosts/while-paused").status_code == 201
    finally:
        follower.kill(signal.SIGCONT)
    eventually(lambda: follower.get("/vhosts/while-paused").ok, what="the paused node's catch-up")


def test_a_stray_client_and_another_cluster_are_refused_on_the_cluster_port(cluster, tmp_path):
    first = cluster.nodes[0]
    with socket.create_connection(("127.0.0.1", first.cluster_port), timeout=10) as stray:
        stray.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert stray.recv(100) == b"", "the cluster port answered an HTTP client"
    port = free_port()
    other = Node(str(tmp_path), "other", [f"127.0.0.1:{port}", cluster.seeds[0]], port, extra=["--cluster-name", "another"]).start()
    try:
        other.wait_listening()
        eventually(lambda: "cluster name 'another' is not this node's 'lepus'" in first.log(), what="the refusal in the log")
        assert other.status()["member"] is False
        assert first.status()["links"]["handshakes_refused"] >= 1
    finally:
        other.kill(signal.SIGTERM)
    assert len(first.get("/nodes").json()) == 3


def test_a_dead_node_is_forgotten_and_a_new_one_takes_its_place(cluster, tmp_path):
    first, _, third = cluster.nodes
    third.kill(signal.SIGKILL)
    # A member that runs is not forgotten.
    refused = subprocess.run([LEPUS_BIN, "ctl", "--url", f"http://127.0.0.1:{first.http_port}", "forget_cluster_node", cluster.nodes[1].name],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "running" in refused.stderr
    forgotten = subprocess.run([LEPUS_BIN, "ctl", "--url", f"http://127.0.0.1:{first.http_port}", "forget_cluster_node", third.name],
                               capture_output=True, text=True, timeout=60)
    assert forgotten.returncode == 0, forgotten.stderr
    replacement = Node(str(tmp_path), "n4", cluster.seeds, free_port()).start()
    cluster.nodes.append(replacement)
    replacement.wait_listening()
    cluster.wait_formed(expected=3)
    names = sorted(entry["name"] for entry in first.get("/nodes").json())
    assert names == sorted([cluster.nodes[0].name, cluster.nodes[1].name, replacement.name])
    assert first.put("/vhosts/after-replacement").status_code == 201
    eventually(lambda: replacement.get("/vhosts/after-replacement").ok, what="the replacement's copy of a new vhost")


def test_a_node_without_cluster_settings_is_not_clustered(tmp_path):
    node = Node(str(tmp_path), "alone", [], 0)
    arguments = [LEPUS_BIN, "server", "--data-dir", node.data_dir, "--bind", "127.0.0.1", "--amqp-port", str(node.amqp_port),
                 "--http-port", str(node.http_port), "--metrics-port", "0", "--stream-port", "0"]
    node.process = subprocess.Popen(arguments, stdout=open(node.log_path, "wb"), stderr=subprocess.STDOUT)
    try:
        node.wait_listening()
        assert node.status()["clustered"] is False
        assert [entry["running"] for entry in node.get("/nodes").json()] == [True]
        assert not (tmp_path / "alone" / "cluster").exists()
    finally:
        node.kill(signal.SIGTERM)


def test_a_node_restarted_with_a_damaged_metadata_log_neither_votes_nor_loses_what_was_committed(cluster):
    leader = cluster.leader()
    follower = next(node for node in cluster.nodes if node is not leader)
    for index in range(10):
        assert leader.put(f"/vhosts/before-damage-{index}").status_code == 201
    eventually(lambda: follower.get("/vhosts/before-damage-9").ok, what="the follower's copy")
    follower.kill(signal.SIGTERM)
    log_path = f"{follower.data_dir}/cluster/metadata/log"
    with open(log_path, "r+b") as log:
        data = bytearray(log.read())
        # A byte in the middle of the log: a whole record that fails its checksum, with valid
        # records after it, is damage (not a torn tail), and may have been acknowledged.
        middle = len(data) // 2
        data[middle] ^= 0xFF
        log.seek(0)
        log.write(data)
    assert leader.put("/vhosts/while-damaged-node-down").status_code == 201
    follower.start()
    follower.wait_listening()
    eventually(lambda: "the metadata log is damaged" in follower.log(), what="the damage reported")
    eventually(lambda: follower.get("/vhosts/while-damaged-node-down").ok and follower.get("/vhosts/before-damage-0").ok,
               what="the damaged node repaired from the leader")
    eventually(lambda: "the metadata log is repaired" in follower.log(), what="the repair reported")
    cluster.wait_formed()
    vhosts = {entry["name"] for entry in follower.get("/vhosts").json()}
    assert {f"before-damage-{index}" for index in range(10)} <= vhosts


def test_raft_and_link_metrics_on_every_node(cluster):
    leader = cluster.leader()
    assert leader.put("/vhosts/for-metrics").status_code == 201
    for node in cluster.nodes:
        text = eventually(lambda node=node: node.metrics() if 'lepus_cluster_members_running 3' in node.metrics() else None,
                          what=f"the metrics of {node.name}")
        for name in ["lepus_metadata_raft_term{group=\"metadata\"}", "lepus_metadata_raft_commit_index{group=\"metadata\"}",
                     "lepus_metadata_raft_applied_index{group=\"metadata\"}", "lepus_metadata_raft_elections_total{group=\"metadata\"}",
                     "lepus_cluster_links_up_total", "lepus_cluster_raft_messages_dropped_total"]:
            assert name in text, f"{name} missing on {node.name}"
        assert f"lepus_metadata_raft_leader{{group=\"metadata\"}} {1 if node is leader else 0}" in text
        # One TYPE line per family: a family registered twice (the metadata group's and the quorum
        # shards' once shared names) makes Prometheus refuse the whole scrape.
        families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
        assert len(families) == len(set(families)), sorted(name for name in families if families.count(name) > 1)
    lag = [line for line in leader.metrics().splitlines() if line.startswith("lepus_metadata_raft_replication_lag_entries{")]
    assert len(lag) == 3, lag


def test_kill_9_of_a_classic_queues_node_under_confirmed_load_loses_nothing_confirmed(cluster, tmp_path):
    """Publishers confirm through the queue's own node; it is killed with kill -9 mid-load,
    restarted (its metadata log replayed, its queue log recovered), and a consumer drains it; the
    history checker reads the whole run. (With quorum queues the publishers stay on the surviving
    nodes; that scenario needs branch 'quorum'.)"""
    import random
    import threading

    from history import History, check, publish_until, read

    seed = int(os.environ.get("CLUSTER_SEED", random.randrange(1 << 30)))
    chooser = random.Random(seed)
    history_path = tmp_path / "history.jsonl"
    history = History(str(history_path))
    home = cluster.nodes[chooser.randrange(3)]
    setup = pika.BlockingConnection(pika.URLParameters(home.url()))
    setup.channel().queue_declare("cluster.load", durable=True)
    setup.close()
    stop = threading.Event()

    publishers = [threading.Thread(target=publish_until, args=(home, f"p{index}", "cluster.load", history, stop, False))
                  for index in range(2)]
    for thread in publishers:
        thread.start()
    time.sleep(1.0 + chooser.random())
    home.kill(signal.SIGKILL)
    stop.set()
    for thread in publishers:
        thread.join(timeout=30)
    home.start()
    home.wait_listening()
    cluster.wait_formed()
    connection = pika.BlockingConnection(pika.URLParameters(home.url()))
    channel = connection.channel()
    while True:
        method, properties, body = channel.basic_get("cluster.load")
        if method is None:
            break
        publisher, sequence = body.decode().split(":")
        history.record(event="deliver", consumer="c", publisher=publisher, sequence=int(sequence), redelivered=method.redelivered)
        channel.basic_ack(method.delivery_tag)
    connection.close()
    history.close()
    events = read(str(history_path))
    confirmed = sum(1 for event in events if event["event"] == "confirm" and event["ack"])
    violations = check(events)
    assert not violations, f"seed {seed}, history {history_path}: {violations[:10]}"
    assert confirmed > 0, f"seed {seed}: nothing was confirmed before the kill (history {history_path})"
    print(f"seed {seed}: {confirmed} confirmed before kill -9 of {home.name}, none lost")


def test_a_restarted_node_deletes_the_exclusive_and_transient_queues_of_its_last_run(cluster):
    first, second, _ = cluster.nodes
    connection = pika.BlockingConnection(pika.URLParameters(first.url()))
    channel = connection.channel()
    channel.queue_declare("cluster.exclusive-before-crash", exclusive=True)
    channel.queue_declare("cluster.transient-before-crash", durable=False)
    channel.queue_declare("cluster.durable-before-crash", durable=True)
    eventually(lambda: second.get("/queues/%2F/cluster.transient-before-crash").ok, what="the queues on the second node")
    first.kill(signal.SIGKILL)
    assert second.get("/queues/%2F/cluster.exclusive-before-crash").ok, "a node that is down keeps its queues listed"
    first.start()
    first.wait_listening()
    for node in (first, second):
        eventually(lambda node=node: node.get("/queues/%2F/cluster.exclusive-before-crash").status_code == 404
                   and node.get("/queues/%2F/cluster.transient-before-crash").status_code == 404,
                   what=f"the last run's exclusive and transient queues gone on {node.name}")
        assert node.get("/queues/%2F/cluster.durable-before-crash").ok
    # A new connection may declare the exclusive name again.
    channel = pika.BlockingConnection(pika.URLParameters(first.url())).channel()
    channel.queue_declare("cluster.exclusive-before-crash", exclusive=True)


def test_a_paused_leader_is_replaced_and_follows_when_it_resumes(cluster):
    leader = cluster.leader()
    others = [node for node in cluster.nodes if node is not leader]
    leader.kill(signal.SIGSTOP)
    try:
        eventually(lambda: others[0].status()["metadata"]["leader"] in {node.name for node in others}, timeout=15,
                   what="a new leader among the running nodes")
        assert others[1].put("/vhosts/while-leader-paused").status_code == 201
    finally:
        leader.kill(signal.SIGCONT)
    # The old leader hears of the new term, steps down and catches up (check-quorum, pre-vote).
    eventually(lambda: leader.get("/vhosts/while-leader-paused").ok, timeout=20, what="the resumed node's catch-up")
    statuses = cluster.wait_formed()
    assert len({status["metadata"]["leader"] for status in statuses}) == 1
    assert leader.status()["metadata"]["role"] == "follower"
