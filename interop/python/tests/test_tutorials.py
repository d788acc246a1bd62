"""The six RabbitMQ tutorials (plus publisher confirms), as tests."""

import uuid

import pika

from conftest import consume_n, get_all, unique, wait_until, wait_for_count, connect, safe_close


def test_hello_world(connection, channel, cleanup):
    queue = cleanup.queue(unique("hello"))
    channel.queue_declare(queue)
    channel.basic_publish(exchange="", routing_key=queue, body=b"Hello World!")

    _, got = consume_n(connection, channel, queue, 1, auto_ack=True)
    assert [body for _, _, body in got] == [b"Hello World!"]
    assert got[0][0].routing_key == queue
    assert got[0][0].exchange == ""
    assert got[0][0].redelivered is False


def test_work_queues_fair_dispatch_with_prefetch_one(connection, cleanup):
    """A busy worker (never acks) holds exactly one message; the other gets the rest."""
    queue = cleanup.queue(unique("task_queue"))
    setup = connection.channel()
    setup.queue_declare(queue, durable=True)

    busy_ch = connection.channel()
    busy_ch.basic_qos(prefetch_count=1)
    quick_ch = connection.channel()
    quick_ch.basic_qos(prefetch_count=1)

    busy, quick = [], []
    busy_ch.basic_consume(queue, lambda ch, m, p, b: busy.append((m, b)))

    def quick_worker(ch, method, props, body):
        quick.append(body)
        ch.basic_ack(method.delivery_tag)

    quick_ch.basic_consume(queue, quick_worker)

    tasks = [("task %d" % i).encode() for i in range(8)]
    for t in tasks:
        setup.basic_publish("", queue, t, pika.BasicProperties(delivery_mode=2))

    # Every task is delivered exactly once, so one delivery too many to the busy worker would be
    # one fewer for the quick one: the counts below need no quiet period.
    wait_until(lambda: len(busy) + len(quick) >= len(tasks), conn=connection)
    assert len(busy) == 1, "prefetch=1 must limit the non-acking worker to one message"
    assert len(quick) == len(tasks) - 1
    assert sorted([busy[0][1]] + quick) == sorted(tasks)
    busy_ch.basic_ack(busy[0][0].delivery_tag)
    assert wait_for_count(queue, 0) == 0


def test_work_queues_durable_queue_and_persistent_message(connection, channel, cleanup):
    queue = cleanup.queue(unique("durable_task"))
    ok = channel.queue_declare(queue, durable=True)
    assert ok.method.queue == queue
    channel.basic_publish("", queue, b"persist me", pika.BasicProperties(delivery_mode=2))

    method, props, body = channel.basic_get(queue, auto_ack=False)
    assert body == b"persist me"
    assert props.delivery_mode == 2
    channel.basic_ack(method.delivery_tag)
    # It really is durable: redeclaring it non-durable is refused.
    ch2 = connection.channel()
    try:
        ch2.queue_declare(queue, durable=False)
        raise AssertionError("redeclare with durable=False should fail")
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 406


def test_work_queues_manual_ack_redelivers_when_worker_dies(amqp_url, channel, cleanup):
    queue = cleanup.queue(unique("task_queue"))
    channel.queue_declare(queue, durable=True)
    channel.basic_publish("", queue, b"important", pika.BasicProperties(delivery_mode=2))

    worker = connect(amqp_url)
    try:
        wch = worker.channel()
        wch.basic_qos(prefetch_count=1)
        _, got = consume_n(worker, wch, queue, 1)
        assert [b for _, _, b in got] == [b"important"]
        assert got[0][0].redelivered is False
    finally:
        safe_close(worker)  # dies without acking

    wait_for_count(queue, 1)
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"important"
    assert method.redelivered is True


def test_publish_subscribe_fanout_to_server_named_exclusive_queues(connection, channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    exchange = cleanup.exchange(unique("logs"))
    channel.exchange_declare(exchange, exchange_type="fanout")
    queues = []
    for _ in range(3):
        ok = channel.queue_declare("", exclusive=True)
        assert ok.method.queue.startswith("amq.gen-")
        channel.queue_bind(ok.method.queue, exchange)
        queues.append(ok.method.queue)
    assert len(set(queues)) == 3

    channel.basic_publish(exchange, "ignored-key", b"log line")
    for q in queues:
        assert wait_for_count(q, 1, channel) == 1
        method, _, body = channel.basic_get(q, auto_ack=True)
        assert body == b"log line"
        assert method.exchange == exchange
        assert method.routing_key == "ignored-key"


def test_routing_direct_exchange(connection, channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    exchange = cleanup.exchange(unique("direct_logs"))
    channel.exchange_declare(exchange, exchange_type="direct")
    q_errors = channel.queue_declare("", exclusive=True).method.queue
    q_all = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(q_errors, exchange, routing_key="error")
    for severity in ("info", "warning", "error"):
        channel.queue_bind(q_all, exchange, routing_key=severity)

    for severity in ("info", "warning", "error", "debug"):
        channel.basic_publish(exchange, severity, severity.encode())

    assert wait_for_count(q_all, 3, channel) == 3
    assert [b for _, _, b in get_all(channel, q_errors)] == [b"error"]
    assert [b for _, _, b in get_all(channel, q_all)] == [b"info", b"warning", b"error"]


def test_topics_several_patterns(connection, channel, cleanup):
    channel.confirm_delivery()  # publishes return once routed: negative checks are not racy
    exchange = cleanup.exchange(unique("topic_logs"))
    channel.exchange_declare(exchange, exchange_type="topic")
    patterns = {
        "orange": ["*.orange.*"],
        "rabbit_lazy": ["*.*.rabbit", "lazy.#"],
        "all": ["#"],
    }
    queues = {}
    for name, keys in patterns.items():
        q = channel.queue_declare("", exclusive=True).method.queue
        for k in keys:
            channel.queue_bind(q, exchange, routing_key=k)
        queues[name] = q

    keys = ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox",
            "lazy.brown.fox", "lazy.pink.rabbit", "quick.brown.fox",
            "quick.orange.male.rabbit", "lazy.orange.male.rabbit", "orange", "lazy"]
    for k in keys:
        channel.basic_publish(exchange, k, k.encode())

    assert wait_for_count(queues["all"], len(keys), channel) == len(keys)
    got = {name: [b.decode() for _, _, b in get_all(channel, q)] for name, q in queues.items()}
    assert got["orange"] == ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox"]
    # lazy.pink.rabbit matches both patterns of the queue but is delivered once.
    assert got["rabbit_lazy"] == ["quick.orange.rabbit", "lazy.orange.elephant", "lazy.brown.fox",
                                  "lazy.pink.rabbit", "lazy.orange.male.rabbit", "lazy"]
    assert got["all"] == keys


def test_rpc_reply_to_and_correlation_id(connection, cleanup):
    rpc_queue = cleanup.queue(unique("rpc_queue"))
    server_ch = connection.channel()
    server_ch.queue_declare(rpc_queue)
    server_ch.basic_qos(prefetch_count=1)

    def fib(n):
        a, b = 0, 1
        for _ in range(n):
            a, b = b, a + b
        return a

    def on_request(ch, method, props, body):
        response = str(fib(int(body))).encode()
        ch.basic_publish("", props.reply_to, response,
                         pika.BasicProperties(correlation_id=props.correlation_id))
        ch.basic_ack(method.delivery_tag)

    server_ch.basic_consume(rpc_queue, on_request)

    client_ch = connection.channel()
    callback_queue = client_ch.queue_declare("", exclusive=True).method.queue
    responses = {}

    def on_response(ch, method, props, body):
        responses[props.correlation_id] = body

    client_ch.basic_consume(callback_queue, on_response, auto_ack=True)

    requests = {}
    for n in (1, 10, 20):
        corr_id = str(uuid.uuid4())
        requests[corr_id] = n
        client_ch.basic_publish("", rpc_queue, str(n).encode(),
                                pika.BasicProperties(reply_to=callback_queue, correlation_id=corr_id))

    wait_until(lambda: len(responses) == len(requests), conn=connection)
    assert responses == {cid: str(fib(n)).encode() for cid, n in requests.items()}


def test_publisher_confirms_all_messages_confirmed(connection, channel, cleanup):
    queue = cleanup.queue(unique("confirms"))
    channel.queue_declare(queue)
    channel.confirm_delivery()
    for i in range(200):
        # In confirm mode pika's BlockingChannel.basic_publish waits for the
        # broker's basic.ack and raises NackError / UnroutableError otherwise.
        channel.basic_publish("", queue, ("msg %d" % i).encode(), mandatory=True)
    assert channel.queue_declare(queue, passive=True).method.message_count == 200


def test_publisher_confirms_async_batch_with_select_connection(amqp_url, cleanup, names):
    """SelectConnection: publish a batch without waiting; every delivery tag 1..N gets acked."""
    from conftest import make_params

    queue = cleanup.queue(unique("confirms-async"))
    total = 500
    state = {"acked": set(), "nacked": set(), "published": 0, "error": None}

    def on_open(conn):
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch):
        ch.queue_declare(queue, callback=lambda _f: ch.confirm_delivery(on_confirm, callback=lambda _f: publish(ch)))

    def publish(ch):
        for i in range(total):
            ch.basic_publish("", queue, ("m%d" % i).encode())
            state["published"] += 1

    def on_confirm(frame):
        method = frame.method
        tag = method.delivery_tag
        target = state["acked"] if isinstance(method, pika.spec.Basic.Ack) else state["nacked"]
        if method.multiple:
            already = state["acked"] | state["nacked"]
            target.update(t for t in range(1, tag + 1) if t not in already)
        else:
            target.add(tag)
        if len(state["acked"]) + len(state["nacked"]) >= total:
            conn.close()

    def on_open_error(_conn, err):
        state["error"] = err
        conn.ioloop.stop()

    conn = pika.SelectConnection(make_params(amqp_url), on_open_callback=on_open,
                                 on_open_error_callback=on_open_error,
                                 on_close_callback=lambda *_: conn.ioloop.stop())
    timer = conn.ioloop.call_later(10, conn.ioloop.stop)
    conn.ioloop.start()
    conn.ioloop.remove_timeout(timer)
    if conn.is_open:
        conn.close()
        conn.ioloop.start()

    assert state["error"] is None
    assert state["published"] == total
    assert state["nacked"] == set()
    assert state["acked"] == set(range(1, total + 1))
    assert wait_for_count(queue, total) == total
