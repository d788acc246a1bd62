"""Topic permissions in the management API, the definitions file and the CLI, as RabbitMQ 3.10.8
serves them (rabbit_mgmt_wm_topic_permission*.erl, rabbitmqctl's *_topic_permissions commands):
the objects' keys and their order, the status codes, what DELETE with and without an exchange
removes, an export/import round trip, durability across a restart, and the deletion of a user's
or a vhost's entries with it. The CLI runs as `lepus ctl` against Lepus and as `rabbitmqctl`
against the RabbitMQ reference node."""

import json

from conftest import quote
from test_ctl import run


def entry_path(vhost, user, exchange=None):
    path = "/topic-permissions/%s/%s" % (quote(vhost), quote(user))
    return path + "/" + quote(exchange) if exchange else path


def make_user(broker, user):
    assert broker.put("/users/" + quote(user), {"password": "topic-secret", "tags": ""}).status_code == 201


def put_entry(broker, vhost, user, exchange, write, read):
    return broker.put(entry_path(vhost, user), {"exchange": exchange, "write": write, "read": read})


def test_the_api_lists_entries_with_rabbitmq_keys_in_its_order(fresh_lepus, names):
    broker = fresh_lepus
    user, vhost = names("tp-user"), names("tp-vhost")
    make_user(broker, user)
    assert broker.put("/vhosts/" + quote(vhost)).status_code == 201
    assert broker.get(entry_path("/", user)).status_code == 404, "no entry yet"
    assert broker.delete(entry_path("/", user)).status_code == 404

    assert put_entry(broker, "/", user, "amq.topic", "^{username}-", "^r\\.").status_code == 201
    # The user already has an entry in the vhost: 204, even for another exchange.
    assert put_entry(broker, "/", user, "amq.topic", "^{username}-", "^r\\.{vhost}").status_code == 204
    assert put_entry(broker, "/", user, "x.other", "", ".*").status_code == 204
    assert put_entry(broker, vhost, user, "t", ".*", ".*").status_code == 201

    first = {"user": user, "vhost": "/", "exchange": "amq.topic", "write": "^{username}-", "read": "^r\\.{vhost}"}
    second = {"user": user, "vhost": "/", "exchange": "x.other", "write": "", "read": ".*"}
    in_vhost = {"user": user, "vhost": vhost, "exchange": "t", "write": ".*", "read": ".*"}
    everything = broker.get("/topic-permissions")
    assert everything.status_code == 200
    mine = [entry for entry in everything.json() if entry["user"] == user]
    assert sorted(mine, key=json.dumps) == sorted([first, second, in_vhost], key=json.dumps)
    assert list(mine[0]) == ["user", "vhost", "exchange", "write", "read"], everything.text

    one = broker.get(entry_path("/", user))
    assert sorted(one.json(), key=json.dumps) == sorted([first, second], key=json.dumps)
    assert list(one.json()[0]) == ["user", "vhost", "exchange", "write", "read"]
    # RabbitMQ answers the exchange's path with every entry of the user in the vhost.
    assert sorted(broker.get(entry_path("/", user, "amq.topic")).json(), key=json.dumps) == sorted(one.json(), key=json.dumps)

    of_vhost = broker.get("/vhosts/%s/topic-permissions" % quote(vhost)).json()
    assert of_vhost == [{"vhost": vhost, "user": user, "exchange": "t", "write": ".*", "read": ".*"}]
    assert list(of_vhost[0]) == ["vhost", "user", "exchange", "write", "read"]
    of_user = broker.get("/users/%s/topic-permissions" % quote(user)).json()
    assert sorted(of_user, key=json.dumps) == sorted([first, second, in_vhost], key=json.dumps)
    assert list(of_user[0]) == ["user", "vhost", "exchange", "write", "read"]
    columns = broker.get("/topic-permissions", params={"columns": "user,exchange"}).json()
    assert {"user": user, "exchange": "x.other"} in columns

    missing_user, missing_vhost = names("tp-nobody"), names("tp-novhost")
    assert broker.get("/users/%s/topic-permissions" % quote(missing_user)).status_code == 404
    assert broker.get("/vhosts/%s/topic-permissions" % quote(missing_vhost)).status_code == 404
    assert broker.get(entry_path(missing_vhost, user)).status_code == 404
    assert broker.get(entry_path("/", missing_user)).status_code == 404
    broker.delete("/users/" + quote(user))
    broker.delete("/vhosts/" + quote(vhost))


def test_put_errors_and_what_delete_removes(fresh_lepus, names):
    broker = fresh_lepus
    user = names("tp-user")
    make_user(broker, user)
    missing_user, missing_vhost = names("tp-nobody"), names("tp-novhost")
    for vhost, who in (("/", missing_user), (missing_vhost, user)):
        refused = put_entry(broker, vhost, who, "amq.topic", ".*", ".*")
        assert (refused.status_code, refused.json()) == (400, {"error": "bad_request", "reason": "vhost_or_user_not_found"})
    assert put_entry(broker, "/", user, "amq.topic", "(", ".*").status_code == 400, "an expression that does not compile"
    lacking = broker.put(entry_path("/", user), {"exchange": "amq.topic", "write": ".*"})
    assert (lacking.status_code, lacking.json()["reason"]) == (400, "[{key_missing,read}]")
    assert broker.get(entry_path("/", user)).status_code == 404, "nothing was set"

    for exchange in ("a", "b", "c"):
        assert put_entry(broker, "/", user, exchange, ".*", ".*").status_code in (201, 204)
    assert broker.delete(entry_path("/", user, "b")).status_code == 204
    assert sorted(entry["exchange"] for entry in broker.get(entry_path("/", user)).json()) == ["a", "c"]
    # While the user has entries in the vhost, deleting an exchange without one is 204 too.
    assert broker.delete(entry_path("/", user, "never-set")).status_code == 204
    assert broker.delete(entry_path("/", user)).status_code == 204
    assert broker.get(entry_path("/", user)).status_code == 404
    assert broker.delete(entry_path("/", user, "a")).status_code == 404
    assert broker.delete(entry_path("/", missing_user)).status_code == 404
    broker.delete("/users/" + quote(user))


def test_entries_go_with_their_user_and_vhost(fresh_lepus, names):
    broker = fresh_lepus
    user, other, vhost = names("tp-user"), names("tp-other"), names("tp-vhost")
    make_user(broker, user)
    make_user(broker, other)
    assert broker.put("/vhosts/" + quote(vhost)).status_code == 201
    assert put_entry(broker, vhost, user, "t", ".*", ".*").status_code == 201
    assert put_entry(broker, "/", user, "t", ".*", ".*").status_code == 201
    assert put_entry(broker, "/", other, "t", ".*", ".*").status_code == 201
    assert broker.delete("/vhosts/" + quote(vhost)).status_code == 204
    assert {(entry["user"], entry["vhost"]) for entry in broker.get("/topic-permissions").json()} >= {(user, "/"), (other, "/")}
    assert (user, vhost) not in {(entry["user"], entry["vhost"]) for entry in broker.get("/topic-permissions").json()}
    assert broker.delete("/users/" + quote(user)).status_code == 204
    remaining = {(entry["user"], entry["vhost"]) for entry in broker.get("/topic-permissions").json()}
    assert (user, "/") not in remaining and (other, "/") in remaining
    broker.delete("/users/" + quote(other))


def test_non_administrators_are_refused(fresh_lepus, names):
    broker = fresh_lepus
    monitor = names("tp-monitor")
    assert broker.put("/users/" + quote(monitor), {"password": "topic-secret", "tags": "monitoring"}).status_code == 201
    auth = (monitor, "topic-secret")
    for path in ("/topic-permissions", entry_path("/", "guest"), "/users/guest/topic-permissions"):
        answer = broker.get(path, auth=auth)
        assert (answer.status_code, answer.json()["reason"]) == (401, "Not administrator user"), path
    broker.delete("/users/" + quote(monitor))


def test_definitions_round_trip_and_survive_a_restart(restartable_broker, names):
    broker = restartable_broker
    user, vhost = names("tp-user"), names("tp-vhost")
    entry = {"user": user, "vhost": vhost, "exchange": "events", "write": "^{username}\\.", "read": "^{vhost}"}
    definitions = {"users": [{"name": user, "password_hash": "AQIDBDB9kM21iEUzN1lZ+6VReCsdNqS0sERdAQTcY6Xs3PMz",
                              "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ""}],
                   "vhosts": [{"name": vhost}],
                   "topic_permissions": [entry]}
    # The same file creates the user and the vhost the entry names.
    assert broker.post("/definitions", definitions).status_code in (200, 201, 204)
    exported = broker.get("/definitions").json()["topic_permissions"]
    assert entry in exported
    assert set(exported[0]) == {"user", "vhost", "exchange", "write", "read"}
    broker.restart()
    assert broker.get(entry_path(vhost, user)).json() == [entry]
    broker.delete("/users/" + quote(user))
    broker.delete("/vhosts/" + quote(vhost))


def test_ctl_sets_lists_and_clears_as_rabbitmqctl(fresh_lepus, names):
    broker = fresh_lepus
    user = names("tp-ctl")
    make_user(broker, user)
    run(broker, "rabbitmqctl", "set_topic_permissions", "-p", "/", user, "amq.topic", "^a", "^b")
    run(broker, "rabbitmqctl", "set_topic_permissions", user, "t.ex", "", ".*")
    listed = json.loads(run(broker, "rabbitmqctl", "list_topic_permissions", "-p", "/", "--formatter", "json").stdout)
    mine = sorted((row for row in listed if row["user"] == user), key=lambda row: row["exchange"])
    assert mine == [{"user": user, "exchange": "amq.topic", "write": "^a", "read": "^b"},
                    {"user": user, "exchange": "t.ex", "write": "", "read": ".*"}]
    table = run(broker, "rabbitmqctl", "-q", "list_topic_permissions").stdout.splitlines()
    assert table[0] == "user\texchange\twrite\tread"
    assert "%s\tt.ex\t\t.*" % user in table
    of_user = json.loads(run(broker, "rabbitmqctl", "list_user_topic_permissions", user, "--formatter", "json").stdout)
    assert sorted(of_user, key=lambda row: row["exchange"]) == [{"vhost": "/", "exchange": "amq.topic", "write": "^a", "read": "^b"},
                                                                {"vhost": "/", "exchange": "t.ex", "write": "", "read": ".*"}]
    # rabbitmqctl 3.10.8 prints this table without a header line.
    assert sorted(run(broker, "rabbitmqctl", "-q", "list_user_topic_permissions", user).stdout.splitlines()) == [
        "/\tamq.topic\t^a\t^b", "/\tt.ex\t\t.*"]

    run(broker, "rabbitmqctl", "clear_topic_permissions", "-p", "/", user, "amq.topic")
    assert [entry["exchange"] for entry in broker.get(entry_path("/", user)).json()] == ["t.ex"]
    run(broker, "rabbitmqctl", "clear_topic_permissions", user)
    assert broker.get(entry_path("/", user)).status_code == 404
    run(broker, "rabbitmqctl", "clear_topic_permissions", user)  # nothing left: still succeeds

    missing_user, missing_vhost = names("tp-nobody"), names("tp-novhost")
    # rabbitmqctl 3.10.8's exit codes: 67 no such user, 69 no such vhost or a bad expression,
    # 65 listing a vhost that does not exist.
    assert run(broker, "rabbitmqctl", "set_topic_permissions", missing_user, "t", "a", "b", expect=None).returncode == 67
    assert run(broker, "rabbitmqctl", "set_topic_permissions", "-p", missing_vhost, user, "t", "a", "b", expect=None).returncode == 69
    assert run(broker, "rabbitmqctl", "set_topic_permissions", user, "t", "(", "b", expect=None).returncode == 69
    assert run(broker, "rabbitmqctl", "clear_topic_permissions", missing_user, expect=None).returncode == 67
    assert run(broker, "rabbitmqctl", "list_topic_permissions", "-p", missing_vhost, expect=None).returncode == 65
    assert run(broker, "rabbitmqctl", "list_user_topic_permissions", missing_user, expect=None).returncode == 69
    broker.delete("/users/" + quote(user))
