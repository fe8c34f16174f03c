"""edgetune device agent (Python), protocol 3 — see device_agents/PROTOCOL.md.

Runs ON the device. Standard library + numpy + whichever runtime the job names (onnxruntime,
ai_edge_litert / tflite_runtime, tvm). It never sees a reference output: it runs, times and returns
raw outputs; the host decides whether they are right. ``run-stdio`` runs the job in a worker
process under a supervisor that bounds its memory, processes, time and output (PROTOCOL.md
"The supervisor").

Its source is the package device_agents/python/edgetune_agent/, one module per responsibility:

  common.py         protocol and version, the agent's own file and work dir, small helpers
  backends/         one module per backend (ort, tflite, tvm: tvm-relax and tvm-kernel, openvino,
                    adapter, torch); backends/__init__.py: the table a request's "backend" names
  info.py           ``info``: fingerprint, runtimes, device state
  fresh.py          fresh inputs (PROTOCOL.md "Fresh inputs")
  job.py            ``run``: the run loop of one job, the job's bounds
  cgroups.py        the job's memory and pids cgroups
  supervisor.py     the worker, the poll, the sweep (PROTOCOL.md "The supervisor")
  run_stdio.py      ``run-stdio``: request on stdin, the job under the supervisor, the bundle on stdout
  zygote.py         ``serve`` and its client (PROTOCOL.md "The zygote")
  session.py        ``session``: many jobs over one channel (PROTOCOL.md "The session")
  gpucheck.py       ``gpu-check``, ``tvm-device``
  main.py           the command line

A device receives them as ONE file, ``edgetune_agent.py``, that the host bundles from these modules
at push time (edgetune/agent/bundle.py: the modules concatenated in dependency order, their imports
of each other commented out). That file is the only form of the agent that runs: its sha256 is what
the host checks before every job and what the zygote vouches for, and ``__file__`` is that file in
every module. Each module imports at its top only the standard library and its siblings (``from
.common import ...``); runtimes are imported inside the functions that use them.
"""
