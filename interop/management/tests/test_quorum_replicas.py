"""Quorum queue replicas by hand over HTTP, on one node: Lepus's `POST
/api/queues/quorum/{vhost}/{name}/replicas/add`, `DELETE .../replicas/delete`, `POST
/api/queues/quorum/replicas/on/{node}/grow` and `DELETE .../replicas/on/{node}/shrink`.

RabbitMQ 3.10.8's management plugin serves none of these paths (its dispatcher,
`rabbit_mgmt_dispatcher`, has no route for them): they fall to its static-file route `/[...]`,
which answers POST and DELETE with 405, `allow: HEAD, GET, OPTIONS` and an empty body, before any
authentication or lookup. So the same cases run against both brokers and each is held to its own
answer: against the RabbitMQ reference node they check that 3.10.8 still serves none of them (what
docs/management.md says, and why Lepus's answers are its own); against Lepus they check the
extension's answers, which follow RabbitMQ 3.10.8's `rabbit_quorum_queue` outcomes as
`rabbitmq-queues` shows them on a single node (measured): adding the node that is already the
member succeeds (`ok`), deleting the last member is refused (`last_node`), a missing queue is not
found, a classic queue is refused, and another node is not a member (RabbitMQ: `node_not_running`).
"""

import urllib.parse

import pytest

OBJECT_NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}
UNKNOWN_NODE = "nobody@nowhere"


def q(text):
    return urllib.parse.quote(text, safe="")


def call(broker, method, path, body):
    return getattr(broker, method.lower())(path, body) if method == "POST" else broker.delete(path, json=body)


@pytest.fixture
def queues(fresh_lepus, names):
    """A quorum queue and a classic queue in vhost /, and the node's name."""
    quorum, classic = names("replicas-qq"), names("replicas-cq")
    assert fresh_lepus.put("/queues/%2F/" + q(quorum), {"durable": True, "arguments": {"x-queue-type": "quorum"}}).status_code == 201
    assert fresh_lepus.put("/queues/%2F/" + q(classic), {"durable": True}).status_code == 201
    node = fresh_lepus.get("/overview").json()["node"]
    yield {"quorum": quorum, "classic": classic, "node": node, "missing": names("replicas-missing")}
    for name in (quorum, classic):
        fresh_lepus.delete("/queues/%2F/" + q(name))


def member_path(queue, action):
    return "/queues/quorum/%2F/" + q(queue) + "/replicas/" + action


# (case, method, path of the queues fixture's names, body, Lepus's status, what Lepus's body holds)
CASES = [
    ("add a member to a missing queue", "POST", lambda n: member_path(n["missing"], "add"), lambda n: {"node": n["node"]},
     404, lambda n, body: body == OBJECT_NOT_FOUND),
    ("add a member to a classic queue", "POST", lambda n: member_path(n["classic"], "add"), lambda n: {"node": n["node"]},
     400, lambda n, body: body == {"error": "bad_request", "reason": "queue '%s' in vhost '/' is not a quorum queue" % n["classic"]}),
    ("add an unknown node", "POST", lambda n: member_path(n["quorum"], "add"), lambda n: {"node": UNKNOWN_NODE},
     404, lambda n, body: body == {"error": "not_found", "reason": "node %s is not a member of this cluster" % UNKNOWN_NODE}),
    ("add the node that is the member", "POST", lambda n: member_path(n["quorum"], "add"), lambda n: {"node": n["node"]},
     200, lambda n, body: len(body["shards"]) == 1 and n["quorum"] in body["shards"][0]["queues"]),
    ("delete a member of a missing queue", "DELETE", lambda n: member_path(n["missing"], "delete"), lambda n: {"node": n["node"]},
     404, lambda n, body: body == OBJECT_NOT_FOUND),
    ("delete the last member", "DELETE", lambda n: member_path(n["quorum"], "delete"), lambda n: {"node": n["node"]},
     400, lambda n, body: body["error"] == "bad_request" and body["reason"].startswith(
         "node %s is the last voter of quorum shard " % n["node"])),
    ("grow the node", "POST", lambda n: "/queues/quorum/replicas/on/%s/grow" % q(n["node"]), lambda n: {"strategy": "all"},
     200, lambda n, body: any(n["quorum"] in shard["queues"] for shard in body["shards"])),
    ("grow an unknown node", "POST", lambda n: "/queues/quorum/replicas/on/%s/grow" % UNKNOWN_NODE, lambda n: {"strategy": "all"},
     404, lambda n, body: body["error"] == "not_found"),
    ("shrink the node", "DELETE", lambda n: "/queues/quorum/replicas/on/%s/shrink" % q(n["node"]), lambda n: {},
     400, lambda n, body: body["reason"].startswith("node %s is the last voter of quorum shard " % n["node"])),
    ("shrink an unknown node", "DELETE", lambda n: "/queues/quorum/replicas/on/%s/shrink" % UNKNOWN_NODE, lambda n: {},
     404, lambda n, body: body["error"] == "not_found"),
]


@pytest.mark.parametrize("case, method, path, body, lepus_status, lepus_body", CASES, ids=[case[0] for case in CASES])
def test_a_quorum_replica_call_on_one_node(fresh_lepus, queues, case, method, path, body, lepus_status, lepus_body):
    response = call(fresh_lepus, method, path(queues), body(queues))
    if fresh_lepus.is_lepus:
        assert response.status_code == lepus_status, (case, response.status_code, response.text)
        assert lepus_body(queues, response.json()), (case, response.text)
    else:
        # RabbitMQ 3.10.8: no such route; the static-file handler refuses the method.
        assert response.status_code == 405, (case, response.status_code, response.text)
        assert response.headers.get("allow") == "HEAD, GET, OPTIONS", (case, dict(response.headers))
        assert response.content == b"", (case, response.text)


def test_a_missing_queue_is_answered_as_rabbitmq_answers_a_missing_queue(fresh_lepus, queues):
    """The missing-queue answer of Lepus's replica paths is the one both brokers give for a missing
    queue on `/api/queues/{vhost}/{name}` (checked here against both)."""
    response = fresh_lepus.get("/queues/%2F/" + q(queues["missing"]))
    assert (response.status_code, response.json()) == (404, OBJECT_NOT_FOUND)
