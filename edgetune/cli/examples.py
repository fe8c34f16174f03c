"""The examples at the end of every command's ``--help`` (its typer epilog), all in one place.

Each example is a command a user can paste; a comment says what it does. No square brackets:
help text is rich markup."""

from __future__ import annotations

EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "": [
        ("edgetune devices ls", "what this machine (and every added device) offers"),
        ("edgetune tune mobilenet --budget 60", "tune the bundled conv net here for a minute"),
        ("edgetune report --format html -o report.html", "the latest runs, with charts"),
    ],
    "tune": [
        ("edgetune tune mobilenet --budget 60", "the bundled conv net, one minute, this machine"),
        ("edgetune tune model.onnx --sweep batch=1,16 --report-dir out", "per batch size; writes out/report.*"),
        ("edgetune tune transformer --dim seq=128 -d pi -d pixel", "two devices in parallel"),
        ("edgetune tune model.onnx --input x=x.npy --format json", "your own input, verified too"),
        ("edgetune tune mobilenet --tvm-trials 256", "add a MetaSchedule-tuned TVM build"),
    ],
    "tune-kernels": [
        ("edgetune tune-kernels --op gemm:M=512,N=512,K=512 --trials 64", "one GEMM on this machine"),
        ("edgetune tune-kernels mobilenet --trials 128 -d pi", "every kernel of a model, on a board"),
    ],
    "judge": [
        ("edgetune judge --op gemm:M=97,N=130,K=75 my_gemm.c", "is this kernel correct, safe, and faster here?"),
        ("edgetune judge --op gemm:M=256,N=256,K=256 candidates/ -d pi -d phone --report-dir out",
         "100 agent-written kernels on two devices: leaderboard + evidence"),
        ("edgetune judge --op softmax:M=128,N=1000 k.cpp -f json", "one entry per kernel per device, for scripts"),
    ],
    "zoo": [
        ("edgetune zoo ls", "the ten architectures, their sizes and dynamic dims"),
        ("edgetune zoo check --size small -d local -d board -d phone --html zoo.html", "the correctness matrix"),
    ],
    "zoo ls": [("edgetune zoo ls", "the ten architectures"), ("edgetune zoo ls -f json", "for scripts")],
    "zoo build": [
        ("edgetune zoo build resnet50 --size full -o models/", "ResNet-50 at its published size (sha256 printed)"),
        ("edgetune zoo build -o zoo-small/", "every model, small size"),
    ],
    "zoo bench": [
        ("edgetune zoo bench --size small --budget 20", "every model, its shape points, vs the strongest baseline"),
        ("edgetune zoo bench resnet50 gpt2 --size full -d pi -f json", "two models at full size on a board"),
    ],
    "zoo check": [
        ("edgetune zoo check --size small", "every model on this machine, every runtime here"),
        ("edgetune zoo check bert_base gpt2 -d pi -d phone -f json", "two models on two devices, for scripts"),
    ],
    "bench": [
        ("edgetune bench mobilenet --config 4063fa7a", "re-measure a stored configuration vs the default"),
        ("edgetune bench model.onnx -c 4063fa7a --rounds 7 --budget 30 -f json", "more rounds, for scripts"),
        ("edgetune bench mobilenet -c 4063fa7a --loadgen singlestream", "under MLPerf LoadGen (p90 latency; docs/mlperf.md)"),
    ],
    "verify": [
        ("edgetune verify mobilenet --config 4063fa7a", "on a fresh random seed (printed)"),
        ("edgetune verify mobilenet -c 4063fa7a --seed 1234567", "replay the seed a verify printed"),
        ("edgetune verify model.onnx -c 4063fa7a --dim batch=4 --input x=x.npy", "another shape, your input"),
    ],
    "report": [
        ("edgetune report", "Markdown: the latest run of each device"),
        ("edgetune report --run RUN_ID --format json -o report.json", "one run, versioned JSON"),
        ("edgetune report --format html -o report.html", "medians with 95% CI charts"),
    ],
    "db": [
        ("edgetune db ls", "tuning runs"),
        ("edgetune db best model.onnx", "best verified configuration per device and shape"),
        ("edgetune db export records.jsonl", "every record with all its samples"),
        ("edgetune db ls --db postgresql://edgetune@labdb:5432/edgetune", "a lab's shared database"),
    ],
    "db ls": [
        ("edgetune db ls --limit 10", "the ten latest runs"),
        ("edgetune db ls --db lab.db --format json", "another database, for scripts"),
    ],
    "db best": [
        ("edgetune db best", "every model"),
        ("edgetune db best model.onnx --format json", "one model, for scripts"),
    ],
    "db migrate": [
        ("edgetune db migrate ~/.edgetune/edgetune.db --to postgresql://edgetune@labdb:5432/edgetune",
         "this workstation's results into the lab's database"),
    ],
    "db export": [
        ("edgetune db export records.jsonl", "one JSON record per line, every raw sample"),
        ("edgetune db export out.jsonl --db lab.db", "from another database"),
    ],
    "devices": [
        ("edgetune devices ls", "health, arch, cores, OS, runtimes, fingerprint"),
        ("edgetune devices add pi ssh://pi@192.168.1.20 --key ~/.ssh/id_ed25519", "a board over SSH"),
        ("edgetune devices add pixel adb://R58M123ABC", "a phone over adb"),
    ],
    "devices ls": [
        ("edgetune devices ls", "connect to each device and show what it reports"),
        ("edgetune devices ls --no-probe", "names and URLs only, no connection"),
        ("edgetune devices ls --db postgresql://edgetune@labdb:5432/edgetune", "and which host drives each one now"),
    ],
    "devices add": [
        ("edgetune devices add pi ssh://pi@192.168.1.20 --key ~/.ssh/id_ed25519", "strict host key checking"),
        ("edgetune devices add lab ssh://me@lab:2222 --trust-on-first-use", "record an unknown host key once"),
        ("edgetune devices add pixel adb://R58M123ABC@labhost:5037", "a phone on a remote adb server"),
    ],
    "devices rm": [
        ("edgetune devices rm pi", "forget the device"),
        ("edgetune devices rm pi --cleanup", "and delete edgetune's work dir on it"),
    ],
    "devices check": [
        ("edgetune devices check", "every device; exit 3 if one is down"),
        ("edgetune devices check pi --format json", "one device, for scripts"),
        ("edgetune devices check gpu", "a GPU device: tries each GPU path there, says what stops each"),
    ],
}


def epilog(command: str) -> str:
    """The Examples section of ``command``'s help ("" for the top level, "db ls" for a subcommand)."""
    lines = ["Examples:"]
    for cmd, what in EXAMPLES[command]:
        lines += ["", f"  # {what}", f"  {cmd}"]
    return "\n".join(lines)
