import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from cluster_harness import LEPUS_BIN, Cluster  # noqa: E402


@pytest.fixture
def cluster(tmp_path, request):
    if not os.path.exists(LEPUS_BIN):
        pytest.fail(f"LEPUS_BIN={LEPUS_BIN} does not exist: build it (cargo build --release) or set LEPUS_BIN")
    nodes = Cluster(str(tmp_path)).start()
    yield nodes
    nodes.stop()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(f"cluster logs: {tmp_path}")


@pytest.fixture
def proxied_cluster(tmp_path, request):
    """Three nodes whose links run through a LinkProxy (cluster.proxy)."""
    if not os.path.exists(LEPUS_BIN):
        pytest.fail(f"LEPUS_BIN={LEPUS_BIN} does not exist: build it (cargo build --release) or set LEPUS_BIN")
    nodes = Cluster(str(tmp_path), proxied=True).start()
    yield nodes
    nodes.stop()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)
