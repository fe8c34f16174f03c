"""A wheel install of edgetune works on its own: it carries the device agents and target files
(edgetune/shipped.py, tools/wheel_data.py) and provisions a device with them, no checkout in sight.

The wheel is built from a copy of this checkout (its tracked and not-ignored files) one of whose
Python agent's modules carries one extra comment line, so the agent the device ran (the one file
bundled from those modules, edgetune/agent/bundle.py) can only have come from the wheel. It goes
into a fresh virtualenv that sees the project's virtualenv's site-packages for its dependencies (a
.pth file: never the repository), and its ``edgetune`` runs from outside the
repository: ``devices ls`` and a short tune of the bundled model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

from edgetune.agent.bundle import bundle
from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
AGENT = "device_agents/python/edgetune_agent"  # the Python agent's modules
MARKED = AGENT + "/main.py"  # the one that gets the marker
MARKER = b"\n# built for tests/unit/test_wheel_install.py: this copy exists only inside the wheel\n"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(argv, timeout, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    assert res.returncode == 0, f"{argv} exited {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _checkout_copy(dest: Path) -> list[str]:
    """The checkout's tracked and not-ignored files copied to ``dest`` (no .venv, build dirs, caches)."""
    require(shutil.which("git") is not None and (REPO / ".git").exists(), "git and a git checkout")
    out = _run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"], 60)
    names = [n for n in out.stdout.split("\0") if n and (REPO / n).is_file()]  # not files deleted since
    for n in names:
        (dest / n).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / n, dest / n)
    return names


def _build_wheel(src: Path, out: Path) -> Path:
    # the project's setuptools when it is new enough (offline, quick); else pip's isolated build env
    try:
        flags = ["--no-build-isolation"] if int(metadata.version("setuptools").split(".")[0]) >= 77 else []
    except metadata.PackageNotFoundError:
        flags = []
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *flags, "-q", "-w", out, src], 300, cwd=out)
    wheels = list(out.glob("edgetune-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _fresh_venv(path: Path, wheel: Path) -> Path:
    _run([sys.executable, "-m", "venv", "--without-pip", path], 120)
    py = path / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], 60).stdout.strip())
    deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})  # this virtualenv's
    (site / "edgetune_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel], 120)
    return py


def test_wheel_carries_agents_and_provisions_a_device(tmp_path):
    src, whl_dir, venv, outside, home = (tmp_path / n for n in ("src", "whl", "venv", "outside", "home"))
    for d in (src, whl_dir, outside, home):
        d.mkdir()
    names = _checkout_copy(src)
    with open(src / MARKED, "ab") as f:
        f.write(MARKER)
    wheel = _build_wheel(src, whl_dir)
    want_agent = bundle(src / AGENT)  # the one file a device gets, from the (marked) copy's modules
    assert MARKER in want_agent

    # every file of the agents and targets (build outputs and dotfiles aside) is in the wheel, as shipped.py says
    with zipfile.ZipFile(wheel) as z:
        inside = set(z.namelist())
        z.extractall(tmp_path / "unzipped", [n for n in inside if n.startswith("edgetune/_agents/python/")])
    # the wheel's modules make exactly that file
    assert bundle(tmp_path / "unzipped" / "edgetune" / "_agents" / "python" / "edgetune_agent") == want_agent
    shipped = {"device_agents/": "edgetune/_agents/", "targets/": "edgetune/_targets/"}
    want = {shipped[top] + n[len(top):] for n in names for top in shipped
            if n.startswith(top) and not Path(n).name.startswith(".")}
    assert want and want <= inside, sorted(want - inside)
    assert {"edgetune/_agents/PROTOCOL.md", "edgetune/_agents/native/agent.c", "edgetune/_targets/host-x86_64.toml",
            "models/__init__.py", "models/mobilenet.py"} <= inside

    py = _fresh_venv(venv, wheel)
    edgetune = venv / "bin" / "edgetune"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(EDGETUNE_HOME=str(home), XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONNOUSERSITE="1")

    # the fresh venv's edgetune is the wheel's, and nothing it imports or reads is the repository's
    probe = ("import json, sys, edgetune, models\n"
             "from edgetune.agent.bundle import agent_package, python_agent\n"
             "from edgetune.build import native\n"
             "from edgetune.kernels.targets import TARGETS_DIR, list_targets\n"
             "native.agent_version()\n"
             "print(json.dumps({'files': [edgetune.__file__, models.__file__, str(agent_package()),"
             " str(native.AGENT_SRC), str(TARGETS_DIR)], 'agent': str(python_agent()), 'targets': list_targets(),"
             " 'path': sys.path}))\n")
    seen = json.loads(_run([py, "-c", probe], 120, cwd=outside, env=env).stdout)
    assert all(Path(f).resolve().is_relative_to(venv.resolve()) and Path(f).exists() for f in seen["files"]), seen
    # the bundled agent is built outside the package (a wheel's site-packages need not be writable)
    agent = Path(seen["agent"])
    assert agent.resolve().is_relative_to((tmp_path / "cache").resolve()) and agent.read_bytes() == want_agent, seen
    assert "host-x86_64" in seen["targets"]
    assert not [p for p in seen["path"] if p and Path(p).resolve().is_relative_to(REPO)
                and not Path(p).resolve().is_relative_to(REPO / ".venv")], seen["path"]

    devices = json.loads(_run([edgetune, "devices", "ls", "-f", "json"], 120, cwd=outside, env=env).stdout)
    local = next(d for d in devices if d["name"] == "local")
    assert local["health"] == "ok", local

    res = _run([edgetune, "tune", "mobilenet", "--budget", "8", "--space", "ort", "--max-candidates", "1",
                "-f", "json"], 300, cwd=outside, env=env)
    report = json.loads(res.stdout)
    assert not report["devices_down"], report["devices_down"]
    (run,) = report["runs"]
    assert run["status"] == "complete", run
    for shape in run["shapes"]:
        best = next(c for c in shape["candidates"] if c["candidate"]["key"] == shape["best"])
        assert best["status"] == "verified", best

    # the agent the device ran is bundled from the wheel's modules: the repository's (as copied) plus the marker
    pushed = home / "work" / "agent" / "edgetune_agent.py"
    assert _sha256(pushed) == hashlib.sha256(want_agent).hexdigest()
    assert MARKER in pushed.read_bytes()
