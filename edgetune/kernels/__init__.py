"""Kernel-level tuning through TVM MetaSchedule.

* ``workloads``: operator workloads (TE) parsed from spec strings, and tuning tasks extracted
  from ONNX models through Relax; each carries its input/output specs, flop count and a
  reference the host keeps to itself.
* ``search``: MetaSchedule search whose runner VERIFIES every measured kernel and takes its
  timings from a pluggable ``measure`` (local subprocess now, the device agent later).
* ``targets``: targets/*.toml loading, ISA feature refinement from /proc/cpuinfo, fp32 peak.

Importing this package does not import TVM; the submodules that need it do.
"""
