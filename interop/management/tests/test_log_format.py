"""`--log-format json`: one JSON object per line on stderr, for log shippers (Lepus only: RabbitMQ
sets its formatter in rabbitmq.conf, `log.console.formatter = json`)."""

import json

import pytest

from conftest import Lepus, lepus_binary


@pytest.mark.lepus_only("a flag of lepus server")
def test_json_logs_are_one_object_per_line(tmp_path):
    broker = Lepus(lepus_binary(), tmp_path / "data", extra_args=["--log-format", "json"])
    try:
        connection = broker.connect()
        connection.close()
    finally:
        broker.stop()
    lines = [line for line in open(broker.log.name, encoding="utf-8").read().splitlines() if line.strip()]
    assert lines, "the broker wrote no log lines"
    records = [json.loads(line) for line in lines]
    for record in records:
        assert {"timestamp", "level", "message", "target"} <= set(record), record
    started = [record for record in records if record["message"] == "Lepus is accepting AMQP 0-9-1 connections"]
    assert started and started[0]["data_dir"] == str(tmp_path / "data"), records


@pytest.mark.lepus_only("a flag of lepus server")
def test_plain_logs_carry_no_colour_codes_off_a_terminal(tmp_path):
    broker = Lepus(lepus_binary(), tmp_path / "data")
    broker.stop()
    text = open(broker.log.name, encoding="utf-8").read()
    assert "accepting AMQP" in text and "\x1b[" not in text
