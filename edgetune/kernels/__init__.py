"""Kernel-level tuning through TVM MetaSchedule.

* ``workloads``: operator workloads (TE, one module each in ``edgetune.ops``) parsed from spec
  strings, and tuning tasks extracted from ONNX models through Relax; each carries its
  input/output specs, flop count and a reference the host keeps to itself (a task's: the
  unscheduled TIR interpreted in float64 by ``tir_interp``).
* ``search``: MetaSchedule search whose runner VERIFIES every measured kernel and takes its
  timings from a pluggable ``measure`` (local subprocess now, the device agent later).
* ``session``: ``tune-kernels`` (search, then final rounds against the strongest baseline, whose
  forms ``baselines`` builds and runs on the device's agents).
* ``targets``: targets/*.toml loading, ISA feature refinement from /proc/cpuinfo, fp32 peak.

Importing this package does not import TVM; the submodules that need it do.
"""
