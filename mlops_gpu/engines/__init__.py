"""The scheduling engines: the core's policy driven over time, keeping state between cycles.

``mlops_gpu.core`` is the policy as a pure function, ``decide(snapshot) -> Decision``. An engine
is what the controller, the simulator and the benchmarks drive with events (submit, finish,
checkpoint, ``cycle(now)``):

- ``reference.FromScratch``: the Python reference, a whole snapshot and ``core.decide`` each
  cycle; the tests' oracle, ``simulate --engine reference``, and the engine where the Rust one is
  not built.
- ``native.NativeEngine``: the same policy in Rust (``mlops_gpu._engine``, built by the install),
  with ``native_explain``/``native_nodes``/``native_support``/``run_copy`` its Python side.
- ``gated.Gated``: job control (arrays, dependencies) in front of either engine.

Invariants:
- Every engine makes the decisions ``core.decide`` makes on the snapshot of its state (the
  conformance tests run both engines cycle by cycle).
- Engines import ``mlops_gpu.core`` and ``mlops_gpu.model``, never the controller, the store or a
  backend; the core never imports an engine (import-linter's layers, ``pyproject.toml``).
"""
