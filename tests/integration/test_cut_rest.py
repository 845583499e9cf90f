"""Reads at the cut never see a transfer torn across tables (issue 52; the workload and its checks are in
tests/integration/cut_workload.py): the REST catalog with MinIO, each batch one request to its transactions endpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.devservers.mariadb import MariaDBServer
from tests.integration.cut_workload import reads_at_the_cut

pytestmark = pytest.mark.integration


def test_reads_at_the_cut_never_see_a_transfer_torn_across_tables_through_sigkills(
    mariadb: MariaDBServer, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    reads_at_the_cut(mariadb, tmp_path, "rest", request)
