"""The queue type as part of a queue's durable definition (storage format 3, kept by format 4's
snapshot and change log), and what RabbitMQ does with `x-queue-type`.

Lepus only (they start their own brokers on data directories of their own):
- A data directory written by the last release of storage format 2 (the committed fixture
  `fixtures/format2-data-dir.tar.gz`, made by `fixtures/make_format2_data_dir.py`, which says what
  it holds in `fixtures/format2-data-dir.json`) starts on the current binary: vhosts, users,
  policies, exchanges, bindings, queues and their messages are all there, and `definitions.json`
  (the snapshot, complete after a graceful stop) now says the current format with a type for every
  queue. The same for a data directory written by the last release of format 3
  (`fixtures/format3-data-dir.tar.gz`, made by the same script with main's binary at 0cdeff6).
- A definitions file of an unknown format stops the start with an error that says why, and is
  left as it was.
- Quorum and stream queues are declared, and imported from a definitions file (with `x-queue-type`
  or with the `type` field `rabbitmqctl export_definitions` writes), as RabbitMQ does.

Against either broker (run against RabbitMQ 3.10.8 too): redeclaring with and without
`x-queue-type` is equivalent or not exactly as RabbitMQ decides, with its texts; the management
API lists `type` for every queue; the definitions export carries `x-queue-type` in the arguments
where it was declared (and has no `type` field, as RabbitMQ 3.10.8's `/api/definitions`).
"""

import base64
import json
import os
import shutil
import signal
import tarfile
import urllib.error
import urllib.parse
import urllib.request

import pika
import pytest

from conftest import connect, make_params, safe_close, unique
from test_data_dir import run_server
from test_lifecycle import LepusBroker

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
FORMAT_2_TARBALL = os.path.join(FIXTURES, "format2-data-dir.tar.gz")
FORMAT_2_MANIFEST = os.path.join(FIXTURES, "format2-data-dir.json")
# The same contents written by main at 0cdeff6, the last release of format 3 (one definitions file
# rewritten on every change), by the same script.
FORMAT_3_TARBALL = os.path.join(FIXTURES, "format3-data-dir.tar.gz")
FORMAT_3_MANIFEST = os.path.join(FIXTURES, "format3-data-dir.json")
STORAGE_FORMAT_VERSION = 4


class ManagedBroker(LepusBroker):
    """A LepusBroker that remembers its management API port, and whose start returns once it has
    recovered its data directory (it listens before it reads it)."""

    def start(self):
        super().start()
        safe_close(self.connect())

    def extra_port_args(self):
        args = super().extra_port_args()
        assert "--http-port" in args, "this lepus has no --http-port: the test reads its management API"
        self.api_url = "http://127.0.0.1:%s/api" % args[args.index("--http-port") + 1]
        return args


def api(base_url, method, path, body=None, user="guest", password="guest"):
    """(status, decoded JSON body or None) of one management API call; HTTP errors are answers."""
    parsed = urllib.parse.urlparse(base_url)
    if parsed.username:
        user, password = urllib.parse.unquote(parsed.username), urllib.parse.unquote(parsed.password or "")
    netloc = "%s:%d" % (parsed.hostname, parsed.port or 15672)
    path_prefix = parsed.path.rstrip("/")
    if not path_prefix.endswith("/api"):
        path_prefix += "/api"
    request = urllib.request.Request(
        "%s://%s%s%s" % (parsed.scheme, netloc, path_prefix, path), method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode(),
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        text = error.read()
        return error.code, json.loads(text) if text else None


def reason_text(answer):
    """An error's reason: Lepus gives a string, RabbitMQ 3.10 an amqp_error tuple whose text is a
    list of character codes."""
    reason = answer["reason"]
    if isinstance(reason, str):
        return reason
    return " ".join("".join(map(chr, part)) if isinstance(part, list) else str(part) for part in reason)


def quoted(name):
    return urllib.parse.quote(name, safe="")


def management_url():
    url = os.environ.get("LEPUS_MANAGEMENT_URL")
    if not url:
        pytest.fail("set LEPUS_MANAGEMENT_URL (http://guest:guest@HOST:PORT/api of the broker under test): "
                    "these tests read the management API")
    return url


def unpack_fixture(tmp_path, tarball_path=FORMAT_2_TARBALL):
    with tarfile.open(tarball_path) as tarball:
        tarball.extractall(tmp_path, filter="data")
    return tmp_path / "data"


def read_definitions(data_dir):
    with open(os.path.join(str(data_dir), "definitions.json")) as definitions:
        return json.load(definitions)


def get_all(url, queue):
    """Every message of `queue`, in order, by basic.get with acks, as (body, redelivered)."""
    connection = pika.BlockingConnection(make_params(url))
    try:
        channel = connection.channel()
        got = []
        while True:
            method, _, body = channel.basic_get(queue)
            if method is None:
                return got
            got.append((body.decode(), method.redelivered))
            channel.basic_ack(method.delivery_tag)
    finally:
        safe_close(connection)


def check_upgraded_contents(broker, manifest):
    """The vhosts, user, policy, bindings and queues of the fixture, through the management API."""
    status, vhosts = api(broker.api_url, "GET", "/vhosts")
    assert status == 200
    assert set(manifest["vhosts"]) <= {vhost["name"] for vhost in vhosts}
    status, user = api(broker.api_url, "GET", "/users/" + manifest["user"]["name"])
    assert status == 200 and user["tags"] == manifest["user"]["tags"], user
    policy = manifest["policy"]
    status, stored_policy = api(broker.api_url, "GET", "/policies/%s/%s" % (quoted(policy["vhost"]), policy["name"]))
    assert status == 200 and stored_policy["definition"] == policy["definition"], stored_policy
    for queue in manifest["queues"]:
        status, listed = api(broker.api_url, "GET", "/queues/%s/%s" % (quoted(queue["vhost"]), queue["name"]))
        assert status == 200, (queue["name"], listed)
        assert listed["type"] == "classic" and listed["durable"] is True, listed
        assert listed["arguments"] == queue["arguments"], listed
        assert listed["messages"] == len(queue["bodies"]), listed
        if queue["routing_key"] is not None:
            status, bindings = api(broker.api_url, "GET", "/bindings/%s/e/%s/q/%s"
                                   % (quoted(queue["vhost"]), manifest["exchange"], queue["name"]))
            assert status == 200 and [binding["routing_key"] for binding in bindings] == [queue["routing_key"]]
    status, limited = api(broker.api_url, "GET", "/queues/%%2F/%s" % "upgrade-limited")
    assert limited["policy"] == policy["name"], limited


@pytest.mark.lepus_only
@pytest.mark.parametrize("old_format, tarball, manifest_path",
                         [(2, FORMAT_2_TARBALL, FORMAT_2_MANIFEST), (3, FORMAT_3_TARBALL, FORMAT_3_MANIFEST)])
def test_an_older_data_directory_is_upgraded_to_the_current_format_with_everything_in_it(tmp_path, old_format, tarball,
                                                                                          manifest_path):
    with open(manifest_path) as manifest_file:
        manifest = json.load(manifest_file)
    data_dir = unpack_fixture(tmp_path, tarball)
    assert read_definitions(data_dir)["storage_format_version"] == old_format, "the fixture is not of its format"
    broker = ManagedBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    try:
        definitions = read_definitions(data_dir)
        assert definitions["storage_format_version"] == STORAGE_FORMAT_VERSION, definitions
        assert [queue["type"] for queue in definitions["queues"]] == ["classic"] * len(manifest["queues"]), definitions
        assert not os.path.exists(os.path.join(str(data_dir), "definitions.json.tmp"))
        check_upgraded_contents(broker, manifest)
        # A queue declared now is stored with its type, and a restart reads the file as it is.
        connection = broker.connect()
        connection.channel().queue_declare("upgrade-new", durable=True, arguments={"x-queue-type": "classic"})
        safe_close(connection)
        # The declare went to the change log; a graceful stop folds the log into the snapshot.
        broker.stop(signal.SIGTERM)
        definitions = read_definitions(data_dir)
        assert {queue["name"]: queue["type"] for queue in definitions["queues"]}["upgrade-new"] == "classic", definitions
        broker.start()
        assert read_definitions(data_dir) == definitions
        check_upgraded_contents(broker, manifest)
        # The stored user's password still logs in; the messages come back in order, the one the
        # old broker delivered without an ack marked redelivered.
        user = manifest["user"]
        for queue in manifest["queues"]:
            url = "amqp://%s:%s@127.0.0.1:%d/%s" % (user["name"], user["password"], broker.port, quoted(queue["vhost"]))
            expected = [(body, body in queue["redelivered"]) for body in queue["bodies"]]
            assert get_all(url, queue["name"]) == expected, queue["name"]
        # The binding routes.
        connection = broker.connect()
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(manifest["exchange"], "plain", b"after-upgrade", pika.BasicProperties(delivery_mode=2))
        safe_close(connection)
        assert get_all(broker.url, "upgrade-plain") == [("after-upgrade", False)]
    finally:
        broker.stop(signal.SIGTERM)


@pytest.mark.lepus_only
def test_a_definitions_file_of_an_unknown_format_is_refused_at_start(tmp_path):
    data_dir = unpack_fixture(tmp_path)
    path = os.path.join(str(data_dir), "definitions.json")
    definitions = read_definitions(data_dir)
    definitions["storage_format_version"] = 99
    with open(path, "w") as out:
        json.dump(definitions, out)
    before = open(path).read()
    code, stderr = run_server(data_dir, "--amqp-port", "0", "--http-port", "0", "--metrics-port", "0")
    assert code != 0
    assert "storage format 99 is not supported" in stderr and "upgrades format 2" in stderr, stderr[-2000:]
    assert open(path).read() == before, "a refused definitions file was rewritten"


@pytest.mark.lepus_only
def test_quorum_and_stream_queues_are_declared_and_imported_as_rabbitmq_does(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = ManagedBroker(os.environ["LEPUS_BIN"], data_dir, tmp_path)
    broker.start()
    try:
        connection = broker.connect()
        for type_name in ("quorum", "stream"):
            declared = unique("declare-" + type_name)
            connection.channel().queue_declare(declared, durable=True, arguments={"x-queue-type": type_name})
            assert api(broker.api_url, "GET", "/queues/%%2F/%s" % declared)[1]["type"] == type_name
        safe_close(connection)
        exchange, classic = unique("import-x"), unique("import-classic")
        quorum, stream = unique("import-quorum"), unique("import-stream")
        common = {"vhost": "/", "durable": True, "auto_delete": False}
        body = {"exchanges": [dict(common, name=exchange, type="fanout", internal=False, arguments={})],
                "queues": [dict(common, name=classic, arguments={}),
                           dict(common, name=quorum, arguments={"x-queue-type": "quorum"}),
                           # rabbitmqctl export_definitions writes the type in a field of its own.
                           dict(common, name=stream, arguments={}, type="stream")],
                "bindings": [{"vhost": "/", "source": exchange, "destination": quorum,
                              "destination_type": "queue", "routing_key": "", "arguments": {}}]}
        status, answer = api(broker.api_url, "POST", "/definitions", body)
        assert status in (200, 204), answer
        for name, type_name in [(classic, "classic"), (quorum, "quorum"), (stream, "stream")]:
            assert api(broker.api_url, "GET", "/queues/%%2F/%s" % name)[1]["type"] == type_name
    finally:
        broker.stop(signal.SIGTERM)


def declare_error(name, arguments, durable=True):
    """None when queue.declare succeeds, else (reply code, reply text) of the channel close."""
    connection = connect()
    try:
        connection.channel().queue_declare(name, durable=durable, arguments=arguments)
        return None
    except pika.exceptions.ChannelClosedByBroker as closed:
        return closed.reply_code, closed.reply_text
    finally:
        safe_close(connection)


def delete_queues(*queues):
    connection = connect()
    try:
        channel = connection.channel()
        for queue in queues:
            channel.queue_delete(queue)
    finally:
        safe_close(connection)


def test_redeclaring_with_or_without_x_queue_type_is_equivalent_as_in_rabbitmq():
    vhost = make_params().virtual_host
    plain, classic, limited = unique("type-plain"), unique("type-classic"), unique("type-limited")
    bogus, mistyped = unique("type-bogus"), unique("type-mistyped")
    try:
        assert declare_error(plain, None) is None
        # Classic is the default: naming it on a queue declared without it is equivalent ...
        assert declare_error(plain, {"x-queue-type": "classic"}) is None
        assert declare_error(plain, {"x-queue-type": "quorum"}) == (
            406, "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '%s' in vhost '%s': "
                 "received the value 'quorum' of type 'longstr' but current is none" % (plain, vhost))
        # ... and so is leaving it out on a queue declared with it.
        assert declare_error(classic, {"x-queue-type": "classic"}) is None
        assert declare_error(classic, None) is None
        assert declare_error(classic, {"x-queue-type": "stream"}) == (
            406, "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '%s' in vhost '%s': "
                 "received 'stream' but current is 'classic'" % (classic, vhost))
        # Any argument on both sides is printed bare.
        assert declare_error(limited, {"x-max-length": 5}) is None
        assert declare_error(limited, {"x-max-length": 10}) == (
            406, "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '%s' in vhost '%s': "
                 "received '10' but current is '5'" % (limited, vhost))
        assert declare_error(limited, {"x-queue-type": "classic"}) == (
            406, "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '%s' in vhost '%s': "
                 "received none but current is the value '5' of type 'signedint'" % (limited, vhost))
        # A type RabbitMQ does not have, or not a string, on a new queue.
        assert declare_error(bogus, {"x-queue-type": "bogus"}) == (
            406, "PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue '%s' in vhost '%s': "
                 "\"unsupported queue type 'bogus'\"" % (bogus, vhost))
        assert declare_error(mistyped, {"x-queue-type": 5}) == (
            406, "PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue '%s' in vhost '%s': "
                 "{unacceptable_type,signedint}" % (mistyped, vhost))
    finally:
        delete_queues(plain, classic, limited, bogus, mistyped)


def test_the_management_api_lists_the_type_of_every_queue_and_exports_x_queue_type_as_declared():
    base_url = management_url()
    vhost = make_params().virtual_host
    plain, classic, transient = unique("api-plain"), unique("api-classic"), unique("api-transient")
    try:
        assert declare_error(plain, None) is None
        assert declare_error(classic, {"x-queue-type": "classic"}) is None
        assert declare_error(transient, None, durable=False) is None
        for name, arguments in [(plain, {}), (classic, {"x-queue-type": "classic"}), (transient, {})]:
            status, listed = api(base_url, "GET", "/queues/%s/%s" % (quoted(vhost), name))
            assert status == 200 and listed["type"] == "classic" and listed["arguments"] == arguments, listed
        status, listed = api(base_url, "GET", "/queues/%s" % quoted(vhost))
        assert status == 200 and {queue["name"] for queue in listed} >= {plain, classic, transient}
        # Every queue has its type (other tests' queues on a RabbitMQ node may be quorum ones).
        assert all(queue.get("type") in ("classic", "quorum", "stream") for queue in listed), listed
        assert {queue["type"] for queue in listed if queue["name"] in (plain, classic, transient)} == {"classic"}
        status, exported = api(base_url, "GET", "/definitions")
        assert status == 200
        entries = {queue["name"]: queue for queue in exported["queues"] if queue["name"] in (plain, classic)}
        assert entries[plain]["arguments"] == {} and entries[classic]["arguments"] == {"x-queue-type": "classic"}
        assert "type" not in entries[plain] and "type" not in entries[classic], entries
        # A type RabbitMQ does not have is refused on import too, naming the queue.
        bogus = unique("api-bogus")
        status, answer = api(base_url, "POST", "/definitions", {"queues": [
            {"name": bogus, "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {"x-queue-type": "bogus"}}]})
        assert status == 400, answer
        assert "unsupported queue type 'bogus'" in reason_text(answer) and bogus in reason_text(answer), answer
        assert api(base_url, "GET", "/queues/%s/%s" % (quoted(vhost), bogus))[0] == 404
    finally:
        delete_queues(plain, classic, transient)
