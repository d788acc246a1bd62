"""The Grafana dashboard shipped for Lepus's own figures (docs/grafana/lepus.json) queries only
metrics a running Lepus answers: every `lepus_*` name in its expressions is on /metrics once the
broker has had some traffic (a renamed or dropped family would leave a panel empty)."""

import json
import os
import re

import pytest

from test_rabbitmq_metrics import make_load

DASHBOARD = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "grafana", "lepus.json")


def dashboard_metric_names():
    expressions = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    expressions.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    with open(DASHBOARD) as file:
        walk(json.load(file))
    return sorted({name for expression in expressions for name in re.findall(r"\blepus_[a-z_]+", expression)})


@pytest.mark.lepus_only("the dashboard of Lepus's own lepus_* figures")
def test_every_metric_the_lepus_dashboard_queries_is_answered(fresh_lepus, names):
    wanted = dashboard_metric_names()
    assert len(wanted) >= 10, "the dashboard's expressions name too few metrics: %s" % wanted
    connection, _, _ = make_load(fresh_lepus, names)
    try:
        present = {name for (name, _labels) in fresh_lepus.metrics()}
        # A histogram or counter family answers under its sample names (_total, _bucket, ...).
        missing = [name for name in wanted
                   if not any(sample == name or sample.startswith(name + "_") for sample in present)]
        assert not missing, missing
    finally:
        connection.close()
