"""edgetune devices ls | add | rm | check"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from edgetune.cli.common import Format, FormatOpt, console, emit_json, run_guarded
from edgetune.cli.examples import epilog
from edgetune.devices.inventory import Inventory
from edgetune.errors import EdgetuneError, UserInputError
from edgetune.text import device_text, plain

app = typer.Typer(no_args_is_help=True, help="The device inventory (local, ssh://, adb://).",
                  epilog=epilog("devices"))
InvOpt = typer.Option(None, "--inventory", help="devices.toml (default ~/.edgetune/devices.toml)")


def _probe(spec, gpu: bool = False) -> dict:
    """Connect, provision the agent, and report what the device says about itself; with ``gpu``, a
    device with an NVIDIA GPU also tries each of edgetune's GPU paths (``gpu_features``).

    Never raises (Ctrl-C aside): whatever goes wrong with one device, a malformed ``info`` reply
    included, makes that device's row "down" with a one-line reason, and the others are listed."""
    row = {"name": spec.name, "url": spec.url, "health": "down"}
    client = None
    try:
        from edgetune.agent.host import AgentClient  # lazy: CLI start-up (imports numpy)

        client = AgentClient(spec)
        info = client.provision()
        fp = info.fingerprint
        rt = {k: v for k, v in info.runtimes.items() if k not in ("numpy", "tflite_module") and not isinstance(v, list)}
        row.update(health="ok", agent=f"{info.agent} {info.agent_version}", arch=info.arch, cores=fp.get("cores"),
                   os=fp.get("os"), kernel=fp.get("kernel"), cpu=fp.get("cpu_model"), soc=fp.get("soc"),
                   max_freq_khz=fp.get("max_freq_khz"), governor=fp.get("governor"), python=info.python,
                   runtimes=rt, emulated=fp.get("emulated"), fingerprint_key=info.fingerprint_key,
                   gpus=fp.get("gpus") or [], precisions=_precisions(info.runtimes))
        if gpu and row["gpus"]:
            row["gpu_features"] = gpu_features(client, info)
    except EdgetuneError as exc:
        row = {"name": spec.name, "url": spec.url, "health": "down", "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - one device's surprise must not hide the others
        row = {"name": spec.name, "url": spec.url, "health": "down", "error": _unexpected(exc)}
    finally:
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
    return row


def _precisions(runtimes: dict) -> dict:
    """What the device computes natively (its CPU's feature flags) and what OpenVINO's CPU plugin
    computes in by default: the precisions the candidate spaces follow."""
    cpu = runtimes.get("cpu_precisions")
    ov = runtimes.get("openvino_cpu_default_precision")
    out: dict = {"cpu": [str(p) for p in cpu] if isinstance(cpu, list) else None}
    if isinstance(ov, list) and ov:
        out["openvino_default"] = str(ov[0]) + (" (approximate)" if ov[0] != "fp32" else "")
    return out


# what the host itself needs for a GPU device, beside what its agent tries there
HOST_GPU_FEATURES = (("nvcc (this host)", "judge: .cu kernels built for the GPU's SM"),)


def gpu_features(client, info) -> list[dict]:
    """Each of edgetune's GPU paths on this device, tried there by its Python agent (``gpu-check``:
    a one-node model on each onnxruntime GPU provider, a sum in PyTorch on CUDA, TVM opening the
    GPU, compute-sanitizer found), and nvcc here: [{feature, used_by, ok, detail}]. What the device
    answers is data, checked and cut to size."""
    import json
    import shutil
    import subprocess

    out: list[dict] = []
    if info.agent != "python":
        out.append({"feature": "Python agent", "used_by": "every GPU path but judge's CUDA mode", "ok": False,
                    "detail": "the device has no python3 with numpy: its native agent only"})
    else:
        c = client.agent_command(["gpu-check"], timeout=600)
        try:
            doc = json.loads(c.text().strip().splitlines()[-1]) if c.ok else None
            feats = doc["features"] if isinstance(doc, dict) else None
            if not isinstance(feats, list) or len(feats) > 16 or not all(isinstance(f, dict) for f in feats):
                raise ValueError("not a list of features")
            out += [{"feature": device_text(f.get("feature"), 60), "used_by": device_text(f.get("used_by"), 120),
                     "ok": f.get("ok") is True, "detail": device_text(f.get("detail"), 400)} for f in feats]
        except (ValueError, KeyError, IndexError, TypeError):
            out.append({"feature": "gpu-check", "used_by": "this table", "ok": False,
                        "detail": "the agent's answer could not be read: "
                                  + device_text(c.text().strip()[-300:] or f"exit {c.returncode}", 300)})
    nvcc = shutil.which("nvcc")
    detail = "not found (make setup installs NVIDIA's nvcc wheels)"
    if nvcc:
        try:
            v = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
            detail = f"{nvcc}: {(v.stdout.strip().splitlines() or ['?'])[-1]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            nvcc, detail = None, f"{nvcc} does not run: {exc}"
    out.append({"feature": HOST_GPU_FEATURES[0][0], "used_by": HOST_GPU_FEATURES[0][1], "ok": bool(nvcc),
                "detail": detail})
    return out


def _features_table(row: dict) -> Table:
    t = Table("feature", "ready", "detail", "used by", title=plain(f"GPU paths on {row['name']}"))
    for f in row["gpu_features"]:
        t.add_row(plain(f["feature"]), Text("yes", "green") if f["ok"] else Text("no", "red"),
                  device_text(f["detail"]), plain(f["used_by"]))
    return t


def _unexpected(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    first = f": {lines[0][:300]}" if lines else ""
    return f"unexpected {type(exc).__name__} while probing the device{first}"


def _freq(khz) -> str:
    try:
        return f" @ {max(float(k) for k in khz) / 1e6:.2f} GHz" if khz else ""
    except (TypeError, ValueError):  # not a list of numbers: nothing to show
        return ""


def _cells(r: dict) -> list:
    """One table row. Every value that came from the device or the inventory is a Text: printed
    as it is (controls escaped), never read as markup."""
    name, url = plain(r["name"]), plain(r["url"])
    if r["health"] != "ok":
        down = Text.assemble(("down", "red"), ": ", device_text(r.get("error", "")))
        return [name, url, down, "", "", "", "", "", "", ""]
    rts = ", ".join(f"{device_text(k)} {device_text(v)}" for k, v in r["runtimes"].items()) or "none"
    prec = r.get("precisions") or {}
    if prec.get("cpu"):
        rts += "; CPU computes " + ", ".join(map(device_text, prec["cpu"]))
    if prec.get("openvino_default"):
        rts += f"; OpenVINO's default: {device_text(prec['openvino_default'])}"
    health = Text.assemble(("ok", "green"), " (emulated)" if r.get("emulated") else "")
    return [name, url, health, plain(r["arch"]), plain(r["cores"]), plain(f"{r['os']} / {r['kernel']}"),
            plain(f"{r['cpu']}{_freq(r.get('max_freq_khz'))}, governor {r.get('governor')}"),
            plain("; ".join(gpu_text(g) for g in r.get("gpus") or []) or "none"), plain(rts),
            plain(r["fingerprint_key"])]


def gpu_text(g: dict) -> str:
    """One GPU as devices ls shows it: NVIDIA H200 sm_90, 139.8 GiB, 1980 MHz, driver 580.159.04, CUDA 13.0."""
    mem = g.get("memory_mib")
    parts = [f"{g.get('name')} {g.get('sm') or '(SM ?)'}",
             f"{mem / 1024:.1f} GiB" if isinstance(mem, (int, float)) else "memory ?",
             f"{g.get('max_sm_clock_mhz')} MHz" if g.get("max_sm_clock_mhz") else "clock ?",
             f"driver {g.get('driver')}", f"CUDA {g.get('cuda_driver') or '?'}"
             + (f" (runtime {g['cuda_runtime']})" if g.get("cuda_runtime") else "")]
    return ", ".join(parts)


def _table(rows, lab: bool = False) -> Table:
    t = Table("name", "url", "health", "arch", "cores", "OS / kernel", "CPU", "GPU", "runtimes", "fingerprint",
              *(["driven by"] if lab else []))
    for r in rows:
        try:
            cells = _cells(r)
        except Exception as exc:  # noqa: BLE001 - a reply that cannot be shown is that device's problem only
            cells = _cells({"name": r.get("name", "?"), "url": r.get("url", "?"), "health": "down",
                            "error": f"malformed info from the device ({type(exc).__name__})"})
        t.add_row(*cells, *([_driven(r)] if lab else []))
    return t


def _driven(r) -> Text:
    d = r.get("driven_by")
    return device_text(f"{d['holder']} (run {d['run_id']})" if d else "free")


def _holders(specs, db: str) -> dict[str, tuple[str, dict | None]]:
    """name -> (device identity, who drives it now or None), from a lab's database."""
    from edgetune.db import Store  # lazy: CLI start-up (imports numpy)
    from edgetune.devices.inventory import device_identity

    store = Store(db, create=False)
    try:
        held = store.device_holders()
    finally:
        store.close()
    return {s.name: (device_identity(s), held.get(device_identity(s))) for s in specs}


@app.command("ls", epilog=epilog("devices ls"))
def ls_cmd(inventory: Optional[str] = InvOpt, fmt: Format = FormatOpt,
           probe: bool = typer.Option(True, "--probe/--no-probe", help="connect to each device"),
           db: Optional[str] = typer.Option(None, "--db", help="a lab's database (postgresql://...): who drives "
                                                                "each device now")) -> None:
    """List devices with health, arch, cores, OS, runtimes and fingerprint (and, with --db, who drives each)."""
    def body():
        specs = list(Inventory(inventory).load().values())
        holders = _holders(specs, db) if db else {}
        if probe:
            with ThreadPoolExecutor(max_workers=max(1, min(8, len(specs)))) as ex:
                rows = list(ex.map(_probe, specs))
        else:
            rows = [{"name": s.name, "url": s.url, "health": "not probed"} for s in specs]
        for r in rows:
            if r["name"] in holders:
                r["identity"], r["driven_by"] = holders[r["name"]]
        if fmt == Format.json:
            emit_json(rows)
        elif probe:
            console.print(_table(rows, lab=bool(db)))
        else:
            for r in rows:
                console.print(Text.assemble(device_text(r["name"]), "\t", device_text(r["url"]),
                                            *(["\t", _driven(r)] if db else [])), highlight=False)
    run_guarded(body)


@app.command("add", epilog=epilog("devices add"))
def add_cmd(name: str, url: str = typer.Argument(..., help="local | ssh://user@host[:port] | adb://SERIAL[@host:port]"),
            key: Optional[str] = typer.Option(None, "--key", help="ssh private key file (stored as a path only)"),
            known_hosts: Optional[str] = typer.Option(None, "--known-hosts"),
            trust_on_first_use: bool = typer.Option(False, "--trust-on-first-use",
                                                    help="accept and record an unknown host key once"),
            workdir: Optional[str] = typer.Option(None, "--workdir", help="agent work dir on the device"),
            python: Optional[str] = typer.Option(None, "--python", help="python on the device (default python3)"),
            native: bool = typer.Option(False, "--native", help="always use the native agent"),
            memory_mb: Optional[int] = typer.Option(None, "--memory-mb",
                                                    help="memory bound of one job on the device, MB (default 4096)"),
            max_procs: Optional[int] = typer.Option(None, "--max-procs",
                                                    help="process bound of one job on the device"),
            no_zygote: bool = typer.Option(False, "--no-zygote",
                                           help="every job in a fresh agent process (no persistent session or "
                                                "zygote for runtime configurations; Python agent)"),
            no_session: bool = typer.Option(False, "--no-session",
                                            help="one transport command per job (no agent session over one "
                                                 "channel; the zygote still serves; Python agent)"),
            identity: Optional[str] = typer.Option(None, "--identity",
                                                   help="the physical device's name in a lab's database, the same on "
                                                        "every host that reaches it (default: from its address)"),
            inventory: Optional[str] = InvOpt) -> None:
    """Add a device to the inventory."""
    def body():
        if memory_mb is not None and memory_mb < 64:
            raise UserInputError(f"--memory-mb {memory_mb}: a job needs at least 64 MB")
        if max_procs is not None and max_procs < 1:
            raise UserInputError(f"--max-procs {max_procs}: must be at least 1")
        spec = Inventory(inventory).add(name, url, key=key, known_hosts=known_hosts,
                                        trust_on_first_use=trust_on_first_use or None, workdir=workdir,
                                        python=python, native=native or None, memory_mb=memory_mb,
                                        max_procs=max_procs, zygote=False if no_zygote else None,
                                        session=False if no_session else None, identity=identity)
        console.print(plain(f"added {spec.name} ({spec.url})"), highlight=False)
    run_guarded(body)


@app.command("rm", epilog=epilog("devices rm"))
def rm_cmd(name: str, inventory: Optional[str] = InvOpt,
           cleanup: bool = typer.Option(False, "--cleanup", help="also delete edgetune's work dir on the device")) -> None:
    """Remove a device (optionally deleting what edgetune put on it)."""
    def body():
        from edgetune.agent.host import AgentClient  # lazy: CLI start-up (imports numpy)

        inv = Inventory(inventory)
        spec = inv.get(name)
        if cleanup:
            client = AgentClient(spec)
            try:
                client.cleanup()
            finally:
                client.close()
        inv.remove(name)
        console.print(plain(f"removed {name}"), highlight=False)
    run_guarded(body)


@app.command("check", epilog=epilog("devices check"))
def check_cmd(name: Optional[str] = typer.Argument(None), inventory: Optional[str] = InvOpt,
              fmt: Format = FormatOpt) -> None:
    """Connect, provision the agent and report health (exit 3 if any device is down); a device
    with an NVIDIA GPU also tries each GPU path (onnxruntime's CUDA and TensorRT providers, PyTorch and
    TVM on CUDA, compute-sanitizer, nvcc here) and says what stops each."""
    def body():
        inv = Inventory(inventory)
        specs = [inv.get(name)] if name else list(inv.load().values())
        rows = [_probe(s, gpu=True) for s in specs]
        if fmt == Format.json:
            emit_json(rows)
        else:
            console.print(_table(rows))
            for r in rows:
                if r.get("gpu_features"):
                    console.print(_features_table(r))
        if any(r["health"] != "ok" for r in rows):
            raise typer.Exit(3)
    run_guarded(body)
