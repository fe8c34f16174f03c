"""Another user on the host or the device plants a work dir or an agent: edgetune refuses the dir,
or finds the agent is not ours (its hash, checked before every job) and pushes ours again."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from edgetune.agent.host import AgentClient, default_workdir
from edgetune.devices.inventory import DeviceSpec, Inventory
from edgetune.errors import DeviceError
from tests.conformance import suite


pytestmark = pytest.mark.usefixtures("private_edgetune_home")


def _spec(request, tmp_path: Path, transport: str, workdir: str) -> DeviceSpec:
    inv = Inventory(tmp_path / "devices.toml")
    if transport == "local":
        inv.add("dev", "local", workdir=workdir)
    else:
        f = request.getfixturevalue("ssh_farm")
        inv.add("dev", f"ssh://{f['user']}@{f['host']}:{f['port']}", key=f["key"], known_hosts=f["known_hosts"],
                python=sys.executable, workdir=workdir)
    return inv.get("dev")


def test_the_default_work_dirs_are_private_not_shared_tmp_paths():
    assert default_workdir(DeviceSpec("l", "local", {})).startswith(os.environ["EDGETUNE_HOME"])
    assert default_workdir(DeviceSpec("s", "ssh://u@h", {})) == "~/.cache/edgetune"
    assert not default_workdir(DeviceSpec("a", "adb://X", {})).startswith("/tmp")


@pytest.mark.parametrize("transport", ["local", "ssh"])
@pytest.mark.parametrize("plant", ["open-mode", "other-owner", "symlink"])
def test_a_planted_work_dir_is_refused_before_anything_runs(request, tmp_path, transport, plant):
    wd = tmp_path / "shared" / "edgetune"
    wd.parent.mkdir()
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    if plant == "open-mode":
        wd.mkdir()
        wd.chmod(0o777)
    elif plant == "other-owner":
        wd.mkdir(mode=0o700)
        os.chown(wd, 65534, 65534)
    else:
        wd.symlink_to(theirs)
    (theirs / "agent").mkdir()
    client = AgentClient(_spec(request, tmp_path, transport, str(wd)))
    try:
        with pytest.raises(DeviceError) as exc:
            client.provision()
    finally:
        client.close()
    msg = str(exc.value)
    assert "refusing to use it" in msg, msg
    assert {"open-mode": "open to other users", "other-owner": "owned by uid 65534",
            "symlink": "not a directory"}[plant] in msg, msg
    assert list((theirs / "agent").iterdir()) == []  # nothing of ours went there


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_an_agent_changed_between_jobs_is_replaced_before_it_runs(request, tmp_path, transport, mlp):
    # a backslash in the work dir too: sha256sum escapes such names (no false "arrived corrupted")
    wd = tmp_path / "work\\dir"
    client = AgentClient(_spec(request, tmp_path, transport, str(wd)))
    case = suite.mlp_case(mlp)
    try:
        assert client.provision().agent == "python"
        agent = wd / "agent" / "edgetune_agent.py"
        genuine = agent.read_bytes()
        # someone rewrites the agent into one that forges a fast, verified-looking answer
        agent.write_text("import sys\nsys.stdout.write('EDGETUNE-BUNDLE 1\\nEND\\n')\n")
        v, res = suite.run_case(client, case, "adapter", suite.ADAPTERS / "correct.py", model=mlp, timeout_s=60)
        assert v.ok, v.reason  # ours ran, not theirs
        assert client.agent_repushes == 1
        assert agent.read_bytes() == genuine
        v, _ = suite.run_case(client, case, "adapter", suite.ADAPTERS / "correct.py", model=mlp, timeout_s=60)
        assert v.ok and client.agent_repushes == 1  # unchanged since: nothing pushed
    finally:
        client.close()
    assert oct(wd.stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_our_own_work_dir_left_readable_by_an_older_version_is_made_private(request, tmp_path, transport):
    wd = tmp_path / "old"
    wd.mkdir()
    wd.chmod(0o755)  # what earlier edgetune versions left (never writable by others)
    client = AgentClient(_spec(request, tmp_path, transport, str(wd)))
    try:
        client.provision()
    finally:
        client.close()
    assert wd.stat().st_mode & 0o777 == 0o700
