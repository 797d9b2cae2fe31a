"""The suite's worker groups (``_worker_group`` in tests/conftest.py) reach pytest-xdist.

Under ``--dist loadgroup`` xdist appends each test's ``xdist_group`` to its node id
(``...@<group>``) and schedules a group as one unit, on one worker. It reads the markers in its
own ``pytest_collection_modifyitems``: one set by a hook that runs after it is ignored, and then
every test is scheduled on its own, so every worker starts its own session brokers and its own
SparkSession, and a file's module fixtures are set up on each worker.
"""

from __future__ import annotations

import pytest


def test_this_test_runs_in_its_files_group(request: pytest.FixtureRequest) -> None:
    config = request.config
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        pytest.skip("not on a pytest-xdist worker under --dist loadgroup")
    assert request.node.nodeid.endswith("@tests/test_worker_groups.py"), request.node.nodeid
