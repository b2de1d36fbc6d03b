"""Fixtures for the server-extension tests: pytest-jupyter's, scoped to this folder.

pytest-jupyter is usually enabled with a root-level ``pytest_plugins``; that would put
its autouse fixtures (a fresh asyncio loop and a ``ServerApp`` clean-up) around every
test of the suite. Importing its fixtures and hooks here keeps them to this folder.

``jp_server_config`` loads only our extension, with ``allow_unauthenticated_access``
off (every route must authenticate) and cluster sessions in a temp dir of the test.
``manager`` is the server's :class:`ClusterManager`; after each test every cluster it
started is stopped and checked for leftover processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_jupyter.jupyter_core import (  # noqa: F401 - fixtures and hooks used by pytest
    echo_kernel_spec,
    jp_asyncio_loop,
    jp_config_dir,
    jp_data_dir,
    jp_env_config_path,
    jp_env_jupyter_path,
    jp_environ,
    jp_home_dir,
    jp_kernel_dir,
    jp_runtime_dir,
    jp_system_config_path,
    jp_system_jupyter_path,
    pytest_pycollect_makeitem,
    pytest_pyfunc_call,
)
from pytest_jupyter.jupyter_server import (  # noqa: F401
    jp_argv,
    jp_auth_header,
    jp_base_url,
    jp_configurable_serverapp,
    jp_fetch,
    jp_http_port,
    jp_logging_stream,
    jp_nbconvert_templates,
    jp_root_dir,
    jp_server_cleanup,
    jp_serverapp,
    jp_template_dir,
    jp_web_app,
)
from pytest_jupyter.pytest_tornasync import (  # noqa: F401
    http_server,
    http_server_client,
    http_server_port,
    io_loop,
)
from traitlets.config import Config

from nbcluster.jupyter.server.manager import ClusterManager
from nbcluster.testing import assert_no_processes


@pytest.fixture
def cluster_temp_dir(tmp_path: Path) -> Path:
    """Where the clusters of one test keep their sessions (nothing else is discovered)."""
    path = tmp_path / "clusters"
    path.mkdir()
    return path


@pytest.fixture
def jp_server_config(cluster_temp_dir: Path) -> Config:
    """A server that requires auth and loads the nbcluster extension."""
    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {
                    "nbcluster.jupyter.server": True,
                    "jupyter_server_terminals": False,
                },
                "allow_unauthenticated_access": False,
                "reraise_server_extension_failures": True,
            },
            "NbclusterServerApp": {"temp_dir": str(cluster_temp_dir)},
        }
    )


@pytest.fixture
def manager(jp_serverapp: Any) -> Iterator[ClusterManager]:  # noqa: F811 - the fixture
    """The extension's manager; its clusters are stopped and leak-checked after the test."""
    mgr: ClusterManager = jp_serverapp.web_app.settings["nbcluster_manager"]
    yield mgr
    sessions = [c.session_dir for c in mgr.owned_clusters().values()]
    mgr.shutdown()
    for s in sessions:
        assert s is not None
        assert_no_processes(s, timeout=15)
