"""Under CI=true a skipped test fails, except the deliberate skips conftest.CI_ALLOWED_SKIPS
lists (issue 35: a check that cannot run must fail in CI, not pass without checking). Each
case runs pytest on a small module of its own with this directory's conftest as a plugin."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

MODULE = """
import pytest

def test_needs_a_tool():
    pytest.skip({reason!r})
"""


def run_pytest(tmp_path, name, body, **env):
    """pytest on module `name` with `body`, under `env` (CI and RINGSTORE_IO unset otherwise)."""
    (tmp_path / name).write_text(body)
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "RINGSTORE_IO")}
    environ.update(env, PYTHONPATH=HERE)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / name)],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        cwd=tmp_path,
    )


def test_a_missing_tool_fails_under_ci(tmp_path):
    out = run_pytest(tmp_path, "test_tool.py", MODULE.format(reason="memcached is not installed"), CI="true")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed" in out.stdout, out.stdout
    assert "skipped under CI=true" in out.stdout and "memcached is not installed" in out.stdout


def test_a_missing_tool_is_a_skip_outside_ci(tmp_path):
    out = run_pytest(tmp_path, "test_tool.py", MODULE.format(reason="memcached is not installed"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 skipped" in out.stdout, out.stdout


def test_listed_skips_stay_skips_under_ci(tmp_path):
    out = run_pytest(
        tmp_path, "test_tls_like.py", MODULE.format(reason="this kernel has TLS offload: the QEMU test covers it"), CI="true"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 skipped" in out.stdout, out.stdout


def test_epoll_module_skips_stay_skips_under_ci(tmp_path):
    body = "def test_runs():\n    assert False, 'must not run on epoll'\n"
    out = run_pytest(tmp_path, "test_xdp.py", body, CI="true", RINGSTORE_IO="epoll")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 skipped" in out.stdout, out.stdout
