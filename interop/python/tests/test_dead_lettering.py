"""Dead-lettering through pika, as RabbitMQ 3.10.8 does it (each test passes against both):

- `x-dead-letter-exchange` / `x-dead-letter-routing-key` arguments and the `dead-letter-exchange` /
  `dead-letter-routing-key` policy keys (the argument wins);
- reasons `rejected` (reject and nack without requeue), `expired` (queue TTL, message expiration),
  `maxlen` (drop-head, and reject-publish-dlx, which also nacks the publish);
- the `x-death` header (count, reason, queue, time, exchange, routing-keys, original-expiration),
  most recent first, counted again for the same queue and reason; `x-first-death-*`;
- cycles of automatic deaths cut, cycles through a reject kept;
- RabbitMQ's 406 texts for bad arguments and the API's 400 for bad policy values.

The exact wire types of the headers are checked by interop/go/dead_letter_test.go (amqp091-go keeps
them apart); a kill -9 test shows Lepus loses no dead-lettered message (Lepus only).
"""

import datetime
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import base64

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, NackError

from conftest import broker_is_lepus, connect, message_count, safe_close, unique, wait_for_count

SETTLE_SECONDS = 0.5


def management_api():
    url = os.environ.get("LEPUS_MANAGEMENT_URL") or os.environ.get("MANAGEMENT_URL")
    if not url:
        pytest.fail("set LEPUS_MANAGEMENT_URL (Lepus) or MANAGEMENT_URL (RabbitMQ) for the policy tests")
    parsed = urllib.parse.urlparse(url)
    user = urllib.parse.unquote(parsed.username or "guest")
    password = urllib.parse.unquote(parsed.password or "guest")
    path = parsed.path.rstrip("/")
    if not path.endswith("/api"):
        path += "/api"
    base = "%s://%s:%d%s" % (parsed.scheme, parsed.hostname, parsed.port or 15672, path)
    authorization = "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode()

    def request(method, api_path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + api_path, data=data, method=method,
                                     headers={"Authorization": authorization, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    return request


@pytest.fixture
def policies():
    """policies(name, pattern, definition) sets a queue policy on '/', deleted after the test."""
    request = management_api()
    made = []

    def put(name, pattern, definition, priority=0):
        status, body = request("PUT", "/policies/%2F/" + name,
                               {"pattern": pattern, "definition": definition, "apply-to": "queues", "priority": priority})
        if status in (200, 201, 204):
            made.append(name)
        return status, body

    yield put
    for name in made:
        request("DELETE", "/policies/%2F/" + name)


def dead_letter_queue(channel, cleanup):
    return cleanup.queue(channel.queue_declare(unique("dead")).method.queue)


def get_one(channel, queue, timeout=5, auto_ack=True):
    """The one message of `queue`, waiting for the dead-letter hop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, properties, body = channel.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            return method, properties, body
        time.sleep(0.02)
    pytest.fail("no message arrived in %s" % queue)


def test_rejected_message_has_x_death_and_first_death_headers(channel, cleanup):
    dead = dead_letter_queue(channel, cleanup)
    source = cleanup.queue(unique("src"))
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    properties = pika.BasicProperties(headers={"keep": "me"}, delivery_mode=2, expiration="60000")
    channel.basic_publish("", source, b"doomed", properties)
    assert wait_for_count(source, 1, channel) == 1
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = get_one(channel, dead)
    assert body == b"doomed"
    assert (method.exchange, method.routing_key) == ("", dead)
    assert properties.delivery_mode == 2
    assert properties.expiration is None, "the expiration is removed on dead-lettering"
    headers = properties.headers
    assert headers["keep"] == "me"
    assert headers["x-first-death-reason"] == "rejected"
    assert headers["x-first-death-queue"] == source
    assert headers["x-first-death-exchange"] == ""
    [death] = headers["x-death"]
    assert death["count"] == 1
    assert death["reason"] == "rejected"
    assert death["queue"] == source
    assert death["exchange"] == ""
    assert death["routing-keys"] == [source]
    assert death["original-expiration"] == "60000"
    assert isinstance(death["time"], datetime.datetime)
    assert abs((datetime.datetime.now(datetime.timezone.utc) - death["time"]).total_seconds()) < 60


def test_nack_without_requeue_dead_letters_through_a_fanout_exchange_keeping_the_routing_key(channel, cleanup):
    exchange = cleanup.exchange(unique("dlx"))
    channel.exchange_declare(exchange, "fanout")
    dead = dead_letter_queue(channel, cleanup)
    channel.queue_bind(dead, exchange)
    source = cleanup.queue(unique("src"))
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": exchange})
    channel.basic_publish("", source, b"m")
    assert wait_for_count(source, 1, channel) == 1
    method, _, _ = channel.basic_get(source)
    channel.basic_nack(method.delivery_tag, requeue=False)
    method, properties, _ = get_one(channel, dead)
    assert (method.exchange, method.routing_key) == (exchange, source), "no dead-letter routing key keeps the message's own"
    assert properties.headers["x-death"][0]["reason"] == "rejected"
    # A reject with requeue does not dead-letter.
    channel.basic_publish("", source, b"again")
    assert wait_for_count(source, 1, channel) == 1
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=True)
    time.sleep(SETTLE_SECONDS)
    assert message_count(source, channel) == 1
    assert message_count(dead, channel) == 0


def test_queue_ttl_expires_into_the_dead_letter_exchange_without_a_consumer(channel, cleanup):
    dead = dead_letter_queue(channel, cleanup)
    source = cleanup.queue(unique("src"))
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
                                             "x-message-ttl": 100})
    channel.basic_publish("", source, b"stale")
    assert wait_for_count(dead, 1, channel) == 1, "expired messages are dead-lettered with nobody looking"
    _, properties, body = get_one(channel, dead)
    assert body == b"stale"
    death = properties.headers["x-death"][0]
    assert death["reason"] == "expired"
    assert "original-expiration" not in death, "a queue TTL is not the message's expiration"


def test_expired_messages_reach_a_consumer_of_the_dead_letter_queue_in_order(connection, channel, cleanup):
    dead = dead_letter_queue(channel, cleanup)
    source = cleanup.queue(unique("src"))
    channel.queue_declare(source, durable=True, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
                                                           "x-message-ttl": 30})
    got = []
    channel.basic_consume(dead, lambda _channel, _method, _properties, body: got.append(body), auto_ack=True)
    for index in range(100):
        channel.basic_publish("", source, b"%d" % index, pika.BasicProperties(delivery_mode=2))
    deadline = time.monotonic() + 5
    while len(got) < 100 and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    assert got == [b"%d" % index for index in range(100)]


def test_a_backlog_paged_to_disk_expires_into_the_dead_letter_exchange_too(channel, cleanup):
    """12 messages of 4 MiB: past Lepus's 32 MiB in memory per queue, 4 are paged to disk (the TTL
    is long enough for all to be published first). Every one expires and is dead-lettered with no
    consumer, paged ones included."""
    dead = dead_letter_queue(channel, cleanup)
    source = cleanup.queue(unique("src"))
    channel.queue_declare(source, durable=True, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
                                                           "x-message-ttl": 3000})
    channel.confirm_delivery()
    body = b"x" * (4 * 1024 * 1024)
    for _ in range(12):
        channel.basic_publish("", source, body, pika.BasicProperties(delivery_mode=2))
    assert wait_for_count(dead, 12, channel, timeout=20) == 12
    assert message_count(source, channel) == 0
    channel.queue_purge(dead)


def test_without_a_dead_letter_routing_key_the_cc_keys_route_too(channel, cleanup):
    """RabbitMQ 3.10 dead-letters with the message's own keys when the queue names no dead-letter
    routing key: its routing key and its CC keys, each routed; a queue two keys reach gets it once;
    x-death's routing-keys lists them (not the BCC keys, taken out at publish: see the next test).
    With a dead-letter routing key only that key routes, and the CC header goes."""
    exchange = cleanup.exchange(unique("dlx"))
    channel.exchange_declare(exchange, "direct")
    source = cleanup.queue(unique("src"))
    by_key = {}
    for key in (source, "cc-one", "cc-two"):
        by_key[key] = cleanup.queue(channel.queue_declare(unique("dead")).method.queue)
        channel.queue_bind(by_key[key], exchange, key)
    both = cleanup.queue(channel.queue_declare(unique("dead-both")).method.queue)
    channel.queue_bind(both, exchange, "cc-one")
    channel.queue_bind(both, exchange, "cc-two")
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": exchange})
    headers = {"CC": ["cc-one", "cc-two"]}
    channel.basic_publish("", source, b"copied", pika.BasicProperties(headers=headers))
    assert wait_for_count(source, 1, channel) == 1
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=False)
    for key in (source, "cc-one", "cc-two"):
        method, properties, body = get_one(channel, by_key[key])
        assert body == b"copied"
        assert (method.exchange, method.routing_key) == (exchange, source), "delivered with the message's routing key"
        assert properties.headers["CC"] == ["cc-one", "cc-two"]
        assert properties.headers["x-death"][0]["routing-keys"] == [source, "cc-one", "cc-two"]
    get_one(channel, both)
    time.sleep(SETTLE_SECONDS)
    assert message_count(both, channel) == 0, "a queue two keys reach holds the letter once"
    # A dead-letter routing key replaces them all, and the CC header goes.
    parked = cleanup.queue(unique("src-keyed"))
    channel.queue_declare(parked, arguments={"x-dead-letter-exchange": exchange, "x-dead-letter-routing-key": "cc-two"})
    channel.basic_publish("", parked, b"keyed", pika.BasicProperties(headers={"CC": ["cc-one"]}))
    assert wait_for_count(parked, 1, channel) == 1
    method, _, _ = channel.basic_get(parked)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = get_one(channel, by_key["cc-two"])
    assert (body, method.routing_key) == (b"keyed", "cc-two")
    assert "CC" not in properties.headers
    assert properties.headers["x-death"][0]["routing-keys"] == [parked, "cc-one"]
    time.sleep(SETTLE_SECONDS)
    assert message_count(by_key["cc-one"], channel) == 0


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_bcc_keys_route_the_dead_letter_too_but_are_not_listed(channel, cleanup, queue_type):
    """RabbitMQ 3.10.8 keeps a message's BCC keys among its routing keys after taking the BCC
    header out at publish, so its dead letter (with no dead-letter routing key) is routed by them
    too, while x-death's routing-keys (read from the headers) does not list them. Lepus keeps them
    beside the message (in its log record, and a quorum queue's entry), not in its headers."""
    exchange = cleanup.exchange(unique("dlx"))
    channel.exchange_declare(exchange, "direct")
    blind = cleanup.queue(channel.queue_declare(unique("dead-bcc")).method.queue)
    channel.queue_bind(blind, exchange, "bcc-key")
    source = cleanup.queue(unique("src"))
    channel.queue_declare(source, durable=queue_type == "quorum",
                          arguments={"x-dead-letter-exchange": exchange, "x-queue-type": queue_type})
    channel.basic_publish("", source, b"blind", pika.BasicProperties(headers={"BCC": ["bcc-key"]}))
    assert wait_for_count(source, 1, channel) == 1
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=False)
    _, properties, body = get_one(channel, blind, timeout=2)
    assert body == b"blind"
    assert "BCC" not in properties.headers
    assert properties.headers["x-death"][0]["routing-keys"] == [source]


IDLE_QUEUES = 2000


def test_one_expiring_queue_among_thousands_of_idle_ones_dead_letters_on_time(connection, channel, cleanup):
    """2,000 idle queues with a TTL and a dead-letter exchange each hold a message that expires in
    10 minutes; then one more queue gets a message with a 300 ms TTL. It is dead-lettered on time,
    as RabbitMQ's per-queue timer does it: not before its TTL, at most 1 s after (Lepus's worker
    sleeps until the earliest deadline of all queues, and the publish must wake it earlier)."""
    dead = dead_letter_queue(channel, cleanup)
    arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
    idle_connection = connect()
    try:
        idle = idle_connection.channel()
        idle.confirm_delivery()
        for _ in range(IDLE_QUEUES):
            name = idle.queue_declare(unique("idle"), exclusive=True,
                                      arguments=dict(arguments, **{"x-message-ttl": 600_000})).method.queue
            idle.basic_publish("", name, b"idle")
        source = cleanup.queue(unique("src"))
        channel.queue_declare(source, arguments=dict(arguments, **{"x-message-ttl": 300}))
        arrived = []
        channel.basic_consume(dead, lambda _channel, _method, _properties, body: arrived.append((time.monotonic(), body)),
                              auto_ack=True)
        channel.confirm_delivery()
        published_at = time.monotonic()
        channel.basic_publish("", source, b"due")
        deadline = published_at + 5
        while not arrived and time.monotonic() < deadline:
            connection.process_data_events(0.01)
        assert arrived, "the expiring message was never dead-lettered"
        elapsed = arrived[0][0] - published_at
        assert arrived[0][1] == b"due"
        assert elapsed >= 0.3 - 0.02, "dead-lettered after %.3f s, before its 300 ms TTL" % elapsed
        assert elapsed <= 1.3, "dead-lettered after %.3f s, over 1 s past its 300 ms TTL" % elapsed
        assert message_count(source, channel) == 0
    finally:
        safe_close(idle_connection)


def test_message_expiration_is_recorded_as_original_expiration(channel, cleanup):
    dead = dead_letter_queue(channel, cleanup)
    source = cleanup.queue(unique("src"))
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    channel.basic_publish("", source, b"short-lived", pika.BasicProperties(expiration="50"))
    assert wait_for_count(dead, 1, channel) == 1
    _, properties, _ = get_one(channel, dead)
    assert properties.expiration is None
    assert properties.headers["x-death"][0]["reason"] == "expired"
    assert properties.headers["x-death"][0]["original-expiration"] == "50"


def test_drop_head_dead_letters_the_oldest_with_reason_maxlen(channel, cleanup):
    dead = dead_letter_queue(channel, cleanup)
    source = cleanup.queue(unique("src"))
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
                                             "x-max-length": 1})
    channel.basic_publish("", source, b"first")
    channel.basic_publish("", source, b"second")
    _, properties, body = get_one(channel, dead)
    assert body == b"first"
    assert properties.headers["x-death"][0]["reason"] == "maxlen"
    assert properties.headers["x-first-death-reason"] == "maxlen"
    assert message_count(source, channel) == 1


def test_reject_publish_dlx_nacks_and_dead_letters_the_refused_message(channel, cleanup):
    dead = dead_letter_queue(channel, cleanup)
    source = cleanup.queue(unique("src"))
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
                                             "x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    channel.confirm_delivery()
    channel.basic_publish("", source, b"kept")
    with pytest.raises(NackError):
        channel.basic_publish("", source, b"refused")
    _, properties, body = get_one(channel, dead)
    assert body == b"refused"
    assert properties.headers["x-death"][0]["reason"] == "maxlen"
    assert message_count(source, channel) == 1
    # reject-publish (without -dlx) only refuses.
    plain = cleanup.queue(unique("src"))
    channel.queue_declare(plain, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
                                            "x-max-length": 0, "x-overflow": "reject-publish"})
    with pytest.raises(NackError):
        channel.basic_publish("", plain, b"refused-quietly")
    time.sleep(SETTLE_SECONDS)
    assert message_count(dead, channel) == 0


def test_a_second_death_in_the_same_queue_counts_and_comes_first(channel, cleanup):
    first = cleanup.queue(unique("a"))
    second = cleanup.queue(unique("b"))
    channel.queue_declare(first, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": second})
    channel.queue_declare(second, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": first})
    channel.basic_publish("", first, b"ping-pong")
    for queue in (first, second, first):
        assert wait_for_count(queue, 1, channel) == 1
        method, _, _ = channel.basic_get(queue)
        channel.basic_reject(method.delivery_tag, requeue=False)
    _, properties, _ = get_one(channel, second)
    deaths = properties.headers["x-death"]
    assert [(death["queue"], death["reason"], death["count"]) for death in deaths] == [
        (first, "rejected", 2), (second, "rejected", 1)]
    assert properties.headers["x-first-death-queue"] == first
    assert properties.headers["x-first-death-reason"] == "rejected"


def test_an_automatic_cycle_is_cut_and_a_rejected_one_is_not(channel, cleanup):
    looping = cleanup.queue(unique("loop"))
    channel.queue_declare(looping, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": looping,
                                              "x-message-ttl": 50})
    channel.basic_publish("", looping, b"round")
    time.sleep(SETTLE_SECONDS)
    counts = []
    for _ in range(20):
        counts.append(message_count(looping, channel))
        time.sleep(0.025)
    assert counts == [0] * 20, "expiring back into the same queue is a cycle: dropped, not going round"
    rejecting = cleanup.queue(unique("again"))
    channel.queue_declare(rejecting, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": rejecting})
    channel.basic_publish("", rejecting, b"round")
    for count in (1, 2):
        assert wait_for_count(rejecting, 1, channel) == 1
        method, properties, _ = channel.basic_get(rejecting)
        channel.basic_reject(method.delivery_tag, requeue=False)
    _, properties, _ = get_one(channel, rejecting)
    assert properties.headers["x-death"][0]["count"] == 2, "a client's reject breaks the cycle"


def test_a_missing_dead_letter_exchange_drops_the_message(channel, cleanup):
    source = cleanup.queue(unique("src"))
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": unique("nowhere")})
    channel.basic_publish("", source, b"m")
    assert wait_for_count(source, 1, channel) == 1
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=False)
    time.sleep(SETTLE_SECONDS)
    assert message_count(source, channel) == 0
    assert channel.is_open


def test_policy_sets_the_dead_letter_exchange_and_the_argument_wins(channel, cleanup, policies):
    prefix = unique("dlxpolicy")
    by_policy = dead_letter_queue(channel, cleanup)
    by_argument = dead_letter_queue(channel, cleanup)
    status, body = policies(prefix, "^" + prefix, {"dead-letter-exchange": "", "dead-letter-routing-key": by_policy})
    assert status in (201, 204), body
    from_policy = cleanup.queue(prefix + "-p")
    channel.queue_declare(from_policy)
    overridden = cleanup.queue(prefix + "-a")
    channel.queue_declare(overridden, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": by_argument})
    time.sleep(SETTLE_SECONDS)
    for queue in (from_policy, overridden):
        channel.basic_publish("", queue, queue.encode())
        assert wait_for_count(queue, 1, channel) == 1
        method, _, _ = channel.basic_get(queue)
        channel.basic_reject(method.delivery_tag, requeue=False)
    assert get_one(channel, by_policy)[2] == from_policy.encode()
    assert get_one(channel, by_argument)[2] == overridden.encode()


def test_bad_policy_values_are_refused_with_400(policies):
    for definition in ({"dead-letter-exchange": 5}, {"dead-letter-routing-key": 5}, {"max-length-bytes": -1},
                       {"max-length-bytes": "a"}, {"overflow": "sideways"}, {"delivery-limit": -1}):
        status, body = policies(unique("bad"), "^never-matches$", definition)
        assert status == 400, (definition, status, body)
        assert "Validation failed" in body


@pytest.mark.parametrize("arguments, text", [
    ({"x-dead-letter-exchange": 1},
     "PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue '{q}' in vhost '/'"),
    ({"x-dead-letter-routing-key": "k"},
     "PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue '{q}' in vhost '/': routing_key_but_no_dlx_defined"),
    ({"x-dead-letter-exchange": "x", "x-dead-letter-routing-key": 5},
     "PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue '{q}' in vhost '/': {{unacceptable_type,signedint}}"),
])
def test_bad_dead_letter_arguments_are_refused_with_rabbitmq_texts(connection, arguments, text):
    queue = unique("bad")
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.queue_declare(queue, arguments=arguments)
    assert (refused.value.reply_code, refused.value.reply_text) == (406, text.format(q=queue))
    check = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as missing:
        check.queue_declare(queue, passive=True)
    assert missing.value.reply_code == 404, "nothing half-made"


def test_delivery_limit_dead_letters_after_the_limit_with_x_delivery_count(channel, cleanup):
    """x-delivery-limit with quorum semantics. RabbitMQ 3.10.8 has it on quorum queues only (a
    classic queue is refused, 406, checked below); Lepus has it on classic queues as an extension,
    so the same behaviour is checked on a quorum queue on RabbitMQ and a classic queue on Lepus."""
    dead = dead_letter_queue(channel, cleanup)
    source = cleanup.queue(unique("limited"))
    arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead, "x-delivery-limit": 1}
    if broker_is_lepus():
        channel.queue_declare(source, arguments=arguments)
    else:
        refused_on_classic = unique("classic")
        probe = channel.connection.channel()
        with pytest.raises(ChannelClosedByBroker) as refused:
            probe.queue_declare(refused_on_classic, arguments=arguments)
        assert (refused.value.reply_code, refused.value.reply_text) == (
            406, "PRECONDITION_FAILED - invalid arg 'x-delivery-limit' for queue '%s' in vhost '/' "
                 "of queue type rabbit_classic_queue" % refused_on_classic)
        channel.queue_declare(source, durable=True, arguments=dict(arguments, **{"x-queue-type": "quorum"}))
    channel.basic_publish("", source, b"fragile", pika.BasicProperties(headers={"keep": "me"}))
    assert wait_for_count(source, 1, channel) == 1
    counts = []
    for _ in range(2):
        method, properties, _ = get_one(channel, source, auto_ack=False)
        counts.append(properties.headers["x-delivery-count"])
        channel.basic_nack(method.delivery_tag, requeue=True)
    assert counts == [0, 1], "a limit of 1 delivers twice, telling each delivery its count"
    _, properties, body = get_one(channel, dead)
    assert body == b"fragile"
    assert properties.headers["keep"] == "me"
    assert properties.headers["x-death"][0]["reason"] == "delivery_limit"
    assert "x-delivery-count" not in properties.headers, "the dead letter is the message as published"
    assert message_count(source, channel) == 0


# ---------------------------------------------------------------------------------------------
# At least once, across a kill -9 (Lepus only: RabbitMQ's classic queues dead-letter at most once)
# ---------------------------------------------------------------------------------------------

MESSAGES = 2000
# Bindings of the dead-letter (headers) exchange that match nothing: each dead letter is checked
# against all of them, so the broker is still routing dead letters when it is killed.
DECOY_BINDINGS = 4000


def drain(channel, queue, seen):
    """Every message of `queue`, consumed without acks, into `seen`."""
    for method, _, body in channel.consume(queue, auto_ack=True, inactivity_timeout=1):
        if method is None:
            break
        seen.add(body)
    channel.cancel()


def connect_when_recovered(broker, timeout=120):
    """A connection once recovery ends: restoring the 4000 bindings takes seconds on a loaded
    machine (past LepusBroker.connect's 10 s), and the listener accepts before it answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return pika.BlockingConnection(pika.URLParameters(broker.url))
        except pika.exceptions.AMQPConnectionError:
            if time.monotonic() > deadline or broker.proc.poll() is not None:
                raise
            time.sleep(0.2)


@pytest.mark.lepus_only
@pytest.mark.timeout(300)
def test_kill_9_while_dead_lettering_loses_no_message(tmp_path):
    """Rejects a large batch through a dead-letter exchange with many bindings (so the broker is
    still routing dead letters when it is killed), with expiring messages dead-lettering beside them,
    then kill -9: after the restart every message is in its source queue or a target (0 lost)."""
    from test_lifecycle import LepusBroker

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = LepusBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    try:
        conn = broker.connect()
        channel = conn.channel()
        channel.exchange_declare("dlx", "headers", durable=True)
        channel.queue_declare("dead", durable=True)
        channel.queue_bind("dead", "dlx", arguments={"x-match": "all"})
        channel.queue_declare("decoy", durable=True)
        for index in range(DECOY_BINDINGS):
            channel.queue_bind("decoy", "dlx", arguments={"x-match": "all", "decoy": index})
        channel.queue_declare("rejecting", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
        channel.queue_declare("expiring", durable=True, arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 20})
        channel.confirm_delivery()
        persistent = pika.BasicProperties(delivery_mode=2)
        for index in range(MESSAGES):
            channel.basic_publish("", "rejecting", b"r%d" % index, persistent)
        rejecter = conn.channel()
        rejecter.basic_qos(prefetch_count=MESSAGES)
        last = None
        for method, _, _ in rejecter.consume("rejecting", inactivity_timeout=5):
            assert method is not None, "the consumer stalled"
            last = method.delivery_tag
            if last == MESSAGES:
                break
        for index in range(MESSAGES // 4):
            channel.basic_publish("", "expiring", b"e%d" % index, persistent)
        rejecter.basic_nack(last, multiple=True, requeue=False)
        conn.process_data_events(0)
        # Past the syncer's idle flush (200 ms): a source settled too early would be on disk by now,
        # while the fan-out of the dead letters is still being written.
        time.sleep(0.3)
        broker.proc.send_signal(signal.SIGKILL)
    finally:
        broker.kill()
    broker.start()
    try:
        conn = connect_when_recovered(broker)
        channel = conn.channel()
        seen = set()
        for queue in ("rejecting", "expiring", "dead"):
            drain(channel, queue, seen)
        time.sleep(SETTLE_SECONDS)
        # Recovered expiring messages are dead-lettered as they are read: read the targets again.
        for queue in ("expiring", "dead"):
            drain(channel, queue, seen)
        expected = {b"r%d" % index for index in range(MESSAGES)} | {b"e%d" % index for index in range(MESSAGES // 4)}
        lost = expected - seen
        assert not lost, "%d dead-lettered messages lost, e.g. %r" % (len(lost), sorted(lost)[:5])
        safe_close(conn)
    finally:
        broker.kill()


# ---------------------------------------------------------------------------------------------
# Permissions: a queue with a dead-letter exchange needs read on itself and write on the exchange
# ---------------------------------------------------------------------------------------------

from test_permissions import user, user_connection  # noqa: E402,F401 (fixtures)


def test_declaring_a_dead_letter_exchange_needs_write_on_it_and_read_on_the_queue(connection, cleanup, user,  # noqa: F811
                                                                                  user_connection):  # noqa: F811
    writable = user.resource("w", "x")
    unwritable = user.resource("r", "x")
    readable_queue = cleanup.queue(user.resource("cr", "q"))
    unreadable_queue = cleanup.queue(user.resource("c", "q"))
    for queue, exchange, refused in ((readable_queue, unwritable, ("exchange", unwritable)),
                                     (unreadable_queue, writable, ("queue", unreadable_queue))):
        channel = user_connection.channel()
        with pytest.raises(ChannelClosedByBroker) as error:
            channel.queue_declare(queue, arguments={"x-dead-letter-exchange": exchange})
        assert (error.value.reply_code, error.value.reply_text) == (403, user.refusal(*refused))
    channel = user_connection.channel()
    channel.queue_declare(readable_queue, arguments={"x-dead-letter-exchange": writable})
    # A redeclaration of the existing queue is not checked again.
    channel.queue_declare(readable_queue, arguments={"x-dead-letter-exchange": writable})
