"""exchange.declare / delete / bind / unbind and routing by exchange type."""

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from conftest import exists, get_all, unique, wait_for_count


def bound_queue(ch, exchange, routing_key="", arguments=None):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, exchange, routing_key=routing_key, arguments=arguments)
    return q


def bodies(ch, queue):
    return [b for _, _, b in get_all(ch, queue)]


# ---------------------------------------------------------------- declare

@pytest.mark.parametrize("xtype", ["direct", "fanout", "topic", "headers"])
def test_declare_each_exchange_type(channel, cleanup, xtype):
    name = cleanup.exchange(unique("x-" + xtype))
    ok = channel.exchange_declare(name, exchange_type=xtype)
    assert isinstance(ok.method, pika.spec.Exchange.DeclareOk)
    assert channel.exchange_declare(name, passive=True).method.NAME == "Exchange.DeclareOk"


def test_redeclare_with_same_attributes_is_ok(channel, cleanup):
    name = cleanup.exchange(unique("x"))
    channel.exchange_declare(name, "topic", durable=True)
    channel.exchange_declare(name, "topic", durable=True)
    assert channel.is_open


def test_declare_passive_on_missing_exchange_is_404_and_closes_channel(connection, channel):
    name = unique("x-missing")
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.exchange_declare(name, passive=True)
    assert ei.value.reply_code == 404
    assert ei.value.reply_text.startswith("NOT_FOUND")
    assert name in ei.value.reply_text
    assert channel.is_closed
    assert connection.is_open
    connection.channel().queue_declare("", exclusive=True)  # connection still usable


def test_redeclare_with_different_type_is_406(connection, channel, cleanup):
    name = cleanup.exchange(unique("x"))
    channel.exchange_declare(name, "direct")
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.exchange_declare(name, "fanout")
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith("PRECONDITION_FAILED")
    assert "type" in ei.value.reply_text
    assert connection.is_open


def test_redeclare_with_different_durable_is_406(connection, channel, cleanup):
    name = cleanup.exchange(unique("x"))
    channel.exchange_declare(name, "direct", durable=False)
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.exchange_declare(name, "direct", durable=True)
    assert ei.value.reply_code == 406
    assert "durable" in ei.value.reply_text


def test_redeclare_with_different_auto_delete_is_406(connection, channel, cleanup):
    name = cleanup.exchange(unique("x"))
    channel.exchange_declare(name, "direct", auto_delete=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.exchange_declare(name, "direct", auto_delete=False)
    assert ei.value.reply_code == 406
    assert "auto_delete" in ei.value.reply_text


def test_redeclare_with_different_internal_is_406(connection, channel, cleanup):
    name = cleanup.exchange(unique("x"))
    channel.exchange_declare(name, "direct")
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.exchange_declare(name, "direct", internal=True)
    assert ei.value.reply_code == 406
    assert "internal" in ei.value.reply_text


def test_declare_unknown_exchange_type_is_503_connection_close(connection):
    with pytest.raises(ConnectionClosedByBroker) as ei:
        connection.channel().exchange_declare(unique("x"), "no-such-type")
    assert ei.value.reply_code == 503
    assert ei.value.reply_text.startswith("COMMAND_INVALID")
    assert connection.is_closed


def test_declare_reserved_amq_prefix_is_403(connection, channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.exchange_declare("amq." + unique("x"), "direct")
    assert ei.value.reply_code == 403
    assert ei.value.reply_text.startswith("ACCESS_REFUSED")
    assert connection.is_open


@pytest.mark.parametrize("name,xtype", [("amq.direct", "direct"), ("amq.fanout", "fanout"),
                                        ("amq.topic", "topic"), ("amq.headers", "headers"),
                                        ("amq.match", "headers")])
def test_standard_amq_exchanges_exist(channel, name, xtype):
    channel.exchange_declare(name, passive=True)
    channel.exchange_declare(name, xtype, durable=True)  # equivalent redeclare is allowed


def test_default_exchange_routes_by_queue_name(channel, temp_queue):
    channel.basic_publish("", temp_queue, b"direct to queue")
    assert wait_for_count(temp_queue, 1, channel) == 1
    method, _, body = channel.basic_get(temp_queue, auto_ack=True)
    assert body == b"direct to queue"
    assert method.exchange == ""


def test_amq_direct_routes_by_binding(channel, temp_queue):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    channel.queue_bind(temp_queue, "amq.direct", routing_key=temp_queue + ".k")
    channel.basic_publish("amq.direct", temp_queue + ".k", b"via amq.direct")
    assert wait_for_count(temp_queue, 1, channel) == 1
    assert bodies(channel, temp_queue) == [b"via amq.direct"]


def test_binding_queue_to_default_exchange_is_403(connection, channel, temp_queue):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_bind(temp_queue, "", routing_key="x")
    assert ei.value.reply_code == 403
    assert ei.value.reply_text.startswith("ACCESS_REFUSED")


def test_deleting_default_exchange_is_403(connection, channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.exchange_delete("")
    assert ei.value.reply_code == 403


def test_deleting_amq_direct_is_403(connection, channel):
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.exchange_delete("amq.direct")
    assert ei.value.reply_code == 403
    assert "amq.direct" in ei.value.reply_text


# ---------------------------------------------------------------- internal / alternate

def test_publish_to_internal_exchange_is_403(connection, channel, cleanup):
    name = cleanup.exchange(unique("x-internal"))
    channel.exchange_declare(name, "fanout", internal=True)
    channel.basic_publish(name, "k", b"nope")  # async: the error comes as channel.close
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_declare("", exclusive=True)
    assert ei.value.reply_code == 403
    assert ei.value.reply_text.startswith("ACCESS_REFUSED")
    assert name in ei.value.reply_text
    assert connection.is_open


def test_internal_exchange_receives_via_exchange_binding(channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    internal = cleanup.exchange(unique("x-internal"))
    front = cleanup.exchange(unique("x-front"))
    channel.exchange_declare(internal, "fanout", internal=True)
    channel.exchange_declare(front, "fanout")
    channel.exchange_bind(destination=internal, source=front)
    q = bound_queue(channel, internal)
    channel.basic_publish(front, "", b"through internal")
    assert wait_for_count(q, 1, channel) == 1
    assert bodies(channel, q) == [b"through internal"]


def test_alternate_exchange_receives_unroutable_messages(connection, channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    ae = cleanup.exchange(unique("x-ae"))
    main = cleanup.exchange(unique("x-main"))
    channel.exchange_declare(ae, "fanout")
    channel.exchange_declare(main, "direct", arguments={"alternate-exchange": ae})
    q_ae = bound_queue(channel, ae)
    q_main = bound_queue(channel, main, "known")

    returned = []
    channel.add_on_return_callback(lambda *a: returned.append(a))
    channel.basic_publish(main, "known", b"routed")
    channel.basic_publish(main, "unknown", b"unroutable", mandatory=True)

    assert wait_for_count(q_ae, 1, channel) == 1
    assert bodies(channel, q_main) == [b"routed"]
    msgs = get_all(channel, q_ae)
    assert [b for _, _, b in msgs] == [b"unroutable"]
    assert msgs[0][0].exchange == main
    assert msgs[0][0].routing_key == "unknown"
    # In confirm mode a basic.return precedes the publish's ack (pika raises UnroutableError), so
    # the confirmed publish above already proved that nothing came back.
    connection.process_data_events(time_limit=0)
    assert returned == [], "a message routed via the alternate exchange is not returned"


def test_alternate_exchange_that_does_not_exist_drops_silently(connection, channel, cleanup):
    main = cleanup.exchange(unique("x-main"))
    channel.exchange_declare(main, "direct", arguments={"alternate-exchange": unique("x-nonexistent")})
    channel.basic_publish(main, "nowhere", b"dropped")
    channel.queue_declare("", exclusive=True)  # round trip: channel still open
    assert channel.is_open


# ---------------------------------------------------------------- delete

def test_delete_if_unused_when_bound_is_406(connection, channel, cleanup):
    name = cleanup.exchange(unique("x"))
    channel.exchange_declare(name, "direct")
    bound_queue(channel, name, "k")
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.exchange_delete(name, if_unused=True)
    assert ei.value.reply_code == 406
    assert ei.value.reply_text.startswith("PRECONDITION_FAILED")
    assert "in use" in ei.value.reply_text
    assert connection.is_open
    assert exists("exchange", name)


def test_delete_if_unused_when_unbound_deletes(channel, cleanup):
    name = cleanup.exchange(unique("x"))
    channel.exchange_declare(name, "direct")
    ok = channel.exchange_delete(name, if_unused=True)
    assert isinstance(ok.method, pika.spec.Exchange.DeleteOk)
    assert not exists("exchange", name)


def test_delete_missing_exchange_is_ok(channel):
    ok = channel.exchange_delete(unique("x-never-existed"))
    assert isinstance(ok.method, pika.spec.Exchange.DeleteOk)
    assert channel.is_open


def test_delete_removes_bindings_and_later_publish_is_404(connection, channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    name = cleanup.exchange(unique("x"))
    channel.exchange_declare(name, "fanout")
    q = bound_queue(channel, name)
    channel.exchange_delete(name)
    # Re-creating it does not bring the binding back.
    channel.exchange_declare(name, "fanout")
    channel.basic_publish(name, "", b"lost")
    channel.exchange_delete(name)
    assert channel.queue_declare(q, passive=True).method.message_count == 0
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.basic_publish(name, "", b"x")  # confirm mode: waits, sees the channel.close
    assert ei.value.reply_code == 404


def test_auto_delete_exchange_is_deleted_when_last_binding_goes(channel, cleanup):
    name = cleanup.exchange(unique("x-ad"))
    channel.exchange_declare(name, "direct", auto_delete=True)
    q = bound_queue(channel, name, "k")
    assert exists("exchange", name)
    channel.queue_unbind(q, name, "k")
    assert not exists("exchange", name)


# ---------------------------------------------------------------- exchange-to-exchange

def test_exchange_to_exchange_bind_routes_and_unbind_stops(channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    src = cleanup.exchange(unique("x-src"))
    dst = cleanup.exchange(unique("x-dst"))
    channel.exchange_declare(src, "direct")
    channel.exchange_declare(dst, "fanout")
    q = bound_queue(channel, dst)
    ok = channel.exchange_bind(destination=dst, source=src, routing_key="rk")
    assert isinstance(ok.method, pika.spec.Exchange.BindOk)

    channel.basic_publish(src, "rk", b"one")
    channel.basic_publish(src, "other", b"not routed")
    assert wait_for_count(q, 1, channel) == 1
    msgs = get_all(channel, q)
    assert [b for _, _, b in msgs] == [b"one"]
    assert msgs[0][0].exchange == src, "deliver carries the exchange the message was published to"

    ok = channel.exchange_unbind(destination=dst, source=src, routing_key="rk")
    assert isinstance(ok.method, pika.spec.Exchange.UnbindOk)
    channel.basic_publish(src, "rk", b"two")
    channel.queue_declare("", exclusive=True)
    assert channel.queue_declare(q, passive=True).method.message_count == 0


def test_exchange_to_exchange_chain_delivers_once_per_queue(channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    a = cleanup.exchange(unique("x-a"))
    b = cleanup.exchange(unique("x-b"))
    c = cleanup.exchange(unique("x-c"))
    for x in (a, b, c):
        channel.exchange_declare(x, "fanout")
    channel.exchange_bind(b, a)
    channel.exchange_bind(c, b)
    channel.exchange_bind(c, a)  # two paths a->c and a->b->c
    q = bound_queue(channel, c)
    channel.basic_publish(a, "", b"dedup")
    assert wait_for_count(q, 1, channel) == 1
    channel.queue_declare("", exclusive=True)
    assert bodies(channel, q) == [b"dedup"]


def test_exchange_bind_missing_source_is_404(connection, channel, cleanup):
    dst = cleanup.exchange(unique("x-dst"))
    channel.exchange_declare(dst, "fanout")
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.exchange_bind(destination=dst, source=unique("x-missing"))
    assert ei.value.reply_code == 404


# ---------------------------------------------------------------- topic

TOPIC_CASES = [
    # pattern, keys that match (from the fixed key list below)
    ("#", ["", "a", "a.b", "a.c", "a.b.c", "a.b.b.c", "b.c"]),
    ("*", ["a"]),
    ("a.#", ["a", "a.b", "a.c", "a.b.c", "a.b.b.c"]),
    ("#.c", ["a.c", "a.b.c", "a.b.b.c", "b.c"]),
    ("a.*.c", ["a.b.c"]),
    ("a.*", ["a.b", "a.c"]),
    ("a.#.c", ["a.c", "a.b.c", "a.b.b.c"]),
    ("*.#", ["a", "a.b", "a.c", "a.b.c", "a.b.b.c", "b.c"]),
    ("", [""]),
    ("a.b.c", ["a.b.c"]),
]
TOPIC_KEYS = ["", "a", "a.b", "a.c", "a.b.c", "a.b.b.c", "b.c"]


def test_topic_pattern_matching(channel, cleanup):
    """`#` matches zero or more words, `*` exactly one; the empty key matches only `#` and ``."""
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    x = cleanup.exchange(unique("x-topic"))
    channel.exchange_declare(x, "topic")
    queues = {pattern: bound_queue(channel, x, pattern) for pattern, _ in TOPIC_CASES}
    for key in TOPIC_KEYS:
        channel.basic_publish(x, key, key.encode())
    assert wait_for_count(queues["#"], len(TOPIC_KEYS), channel) == len(TOPIC_KEYS)
    channel.queue_declare("", exclusive=True)
    got = {p: [b.decode() for b in bodies(channel, q)] for p, q in queues.items()}
    assert got == {p: keys for p, keys in TOPIC_CASES}


def test_topic_empty_words(channel, cleanup):
    """Empty words count as words: `a.` has two words, `..` has three."""
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    x = cleanup.exchange(unique("x-topic"))
    channel.exchange_declare(x, "topic")
    patterns = ["a.*", "*.*", "#", "a.#"]
    queues = {p: bound_queue(channel, x, p) for p in patterns}
    for key in ["a.", ".a", ".."]:
        channel.basic_publish(x, key, key.encode())
    assert wait_for_count(queues["#"], 3, channel) == 3
    got = {p: [b.decode() for b in bodies(channel, q)] for p, q in queues.items()}
    assert got == {"a.*": ["a."], "*.*": ["a.", ".a"], "#": ["a.", ".a", ".."], "a.#": ["a."]}


def test_topic_queue_with_overlapping_bindings_gets_one_copy(channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    x = cleanup.exchange(unique("x-topic"))
    channel.exchange_declare(x, "topic")
    q = channel.queue_declare("", exclusive=True).method.queue
    for p in ("a.*", "*.b", "#", "a.b"):
        channel.queue_bind(q, x, p)
    channel.basic_publish(x, "a.b", b"once")
    assert wait_for_count(q, 1, channel) == 1
    channel.queue_declare("", exclusive=True)
    assert bodies(channel, q) == [b"once"]


# ---------------------------------------------------------------- headers

HEADER_MESSAGES = [
    ("both", {"format": "pdf", "type": "report"}),
    ("format-only", {"format": "pdf"}),
    ("type-only", {"type": "report"}),
    ("wrong-value", {"format": "zip", "type": "log"}),
    ("none", {}),
    ("both+x", {"format": "pdf", "type": "report", "x-extra": "1"}),
    ("x-only", {"x-format": "pdf"}),
]


@pytest.mark.parametrize("x_match,binding,expected", [
    ("all", {"format": "pdf", "type": "report"}, ["both", "both+x"]),
    ("any", {"format": "pdf", "type": "report"}, ["both", "format-only", "type-only", "both+x"]),
    (None, {"format": "pdf", "type": "report"}, ["both", "both+x"]),  # default is all
    ("all", {"x-format": "pdf"}, ["both", "format-only", "type-only", "wrong-value", "none",
                                 "both+x", "x-only"]),  # x- binding args are ignored by all
    ("any", {"x-format": "pdf"}, []),
    ("all-with-x", {"x-format": "pdf"}, ["x-only"]),
    ("any-with-x", {"x-format": "pdf", "type": "nope"}, ["x-only"]),
    ("any-with-x", {"format": "pdf"}, ["both", "format-only", "both+x"]),
])
def test_headers_exchange_x_match(channel, cleanup, x_match, binding, expected):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    x = cleanup.exchange(unique("x-headers"))
    channel.exchange_declare(x, "headers")
    args = dict(binding)
    if x_match is not None:
        args["x-match"] = x_match
    q = bound_queue(channel, x, arguments=args)
    catch_all = bound_queue(channel, x, arguments={"x-match": "any"})  # matches nothing: no keys
    for name, headers in HEADER_MESSAGES:
        channel.basic_publish(x, "rk-ignored", name.encode(), pika.BasicProperties(headers=headers))
    channel.queue_declare("", exclusive=True)  # round trip so routing is done
    wait_for_count(q, len(expected), channel)
    assert [b.decode() for b in bodies(channel, q)] == expected
    assert bodies(channel, catch_all) == []


def test_headers_exchange_value_types_must_match(channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    x = cleanup.exchange(unique("x-headers"))
    channel.exchange_declare(x, "headers")
    q = bound_queue(channel, x, arguments={"x-match": "all", "n": 1})
    channel.basic_publish(x, "", b"int", pika.BasicProperties(headers={"n": 1}))
    channel.basic_publish(x, "", b"string", pika.BasicProperties(headers={"n": "1"}))
    channel.queue_declare("", exclusive=True)
    wait_for_count(q, 1, channel)
    assert bodies(channel, q) == [b"int"]


def test_headers_exchange_invalid_x_match_is_406(connection, channel):
    q = channel.queue_declare("", exclusive=True).method.queue
    with pytest.raises(ChannelClosedByBroker) as ei:
        channel.queue_bind(q, "amq.headers", arguments={"x-match": "bogus"})
    assert ei.value.reply_code == 406
    assert "x-match" in ei.value.reply_text
