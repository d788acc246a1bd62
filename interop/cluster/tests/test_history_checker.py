"""The history checker finds each violation it promises to (no broker needed)."""

from history import check


def publish(publisher, sequence, ack=True):
    return [{"event": "publish", "publisher": publisher, "sequence": sequence},
            {"event": "confirm", "publisher": publisher, "sequence": sequence, "ack": ack}]


def deliver(publisher, sequence, redelivered=False):
    return {"event": "deliver", "consumer": "c", "publisher": publisher, "sequence": sequence, "redelivered": redelivered}


def test_a_clean_history_passes_and_redeliveries_are_allowed():
    events = publish("p", 1) + publish("p", 2) + [deliver("p", 1), deliver("p", 2), deliver("p", 2, redelivered=True)]
    assert check(events) == []


def test_each_violation_is_found():
    lost = publish("p", 1) + publish("p", 2) + [deliver("p", 2)]
    assert check(lost) == ["confirmed ('p', 1) was never delivered"]
    invented = [deliver("q", 7)]
    assert check(invented) == ["delivered ('q', 7), which was never published"]
    reordered = publish("p", 1) + publish("p", 2) + [deliver("p", 2), deliver("p", 1)]
    assert check(reordered) == ["publisher p: 1 first delivered after 2"]
    assert check(reordered, single_consumer=False) == []
    settled = publish("p", 1) + [deliver("p", 1), {"event": "ack_confirmed", "publisher": "p", "sequence": 1}, deliver("p", 1, True)]
    assert check(settled) == ["delivered ('p', 1) again after its ack was confirmed"]
    nacked = publish("p", 1, ack=False)
    assert check(nacked) == [], "a nacked message may be lost"
