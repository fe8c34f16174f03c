"""MetaSchedule tuning databases (``JSONDatabase``), one per device fingerprint, target and build
identity, so records never mix across devices, compilers, TVM versions or thread counts."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from edgetune.build.identity import build_identity, identity_key
from edgetune.build.tvm_kernel import as_tvm_target, resolve_cross_cc


def slug(text: str, limit: int = 48) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:limit] or "x"
    return f"{s}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def target_key(target) -> str:
    """A stable short name for a TVM target: kind + hash of its full JSON."""
    tgt = as_tvm_target(target)
    text = json.dumps(tgt.export(), sort_keys=True, default=str)
    return f"{tgt.kind.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def database_dir(db_dir: str | os.PathLike, fingerprint: str, target, *, cross_cc: str | None = None,
                 threads: int | None = None) -> Path:
    """``db_dir/<fingerprint slug>/<target key>/<build identity key>``: records never mix across
    devices, targets, TVM versions, edgetune versions, compilers (``cross_cc`` as resolved for the
    target: path + ``--version``) or kernel thread counts (``threads``; default: the target's
    ``num-cores``, else this host's CPU count, which is what the default measurer uses)."""
    tgt = as_tvm_target(target)
    identity = build_identity(resolve_cross_cc(tgt, cross_cc), threads or num_cores(tgt))
    return Path(db_dir) / slug(fingerprint) / target_key(tgt) / identity_key(identity)


def open_database(path: str | os.PathLike):
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    return JSONDatabase(str(path / "workloads.json"), str(path / "records.json"), allow_missing=True)


def workload_records(db, mod) -> list:
    """All records (valid and failed) of ``mod`` in ``db``."""
    import tvm_ffi

    return [r for r in db.get_all_tuning_records() if tvm_ffi.structural_equal(r.workload.mod, mod)]


def num_cores(tgt) -> int:
    try:
        return int(tgt.attrs.get("num-cores", 0)) or (os.cpu_count() or 1)
    except Exception:  # noqa: BLE001
        return os.cpu_count() or 1


