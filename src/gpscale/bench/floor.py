"""How far each method's steps are from their FLOP floor on this machine (``gpscale bench --protocol floor``).

For a method at a size (n rows of d features, its options, a batch of B rows for a minibatch method, a dtype) it
counts the floating-point operations of one training step (loss, backward and optimiser step, as
:func:`gpscale.train.fit` takes it; a minibatch model's is the mean step of an epoch of up to :data:`EPOCH_STEPS`),
of the posterior fit and of predicting one row, by running each under a dispatch mode that counts them: every
matrix product as torch counts it, plus the factorisations and solves that torch leaves out (:data:`LINALG_FLOPS`).
Element-wise work (exp, softmax, the distances after their one product) is not counted, so time spent on it shows
as a ratio above 1.

The floor is those FLOPs at this machine's matrix-product rate, measured in the same run (a square product of 2,048
rows, the best of five) in float32 and float64: each operator's FLOPs at the rate of the dtype it computes in, so a
float32 model's float64 cores count at the float64 rate. The ratio is the best of several measured wall times over
the floor. On a busy machine both are slowed alike only roughly: compare ratios from one run.

A small step is bound by how many operators it dispatches, not by its FLOPs: each costs microseconds however little
it computes. The same mode counts the training step's operators other than views (a view computes nothing), and
the run measures the least time of one operator on this machine (:func:`operator_seconds`); the step's floor with
operators adds that time for each, which says how much of a step's distance from its FLOP floor its operator count
alone explains.
"""
from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, shape_wrapper

from .._version import __version__
from ..distributed import LOCAL
from ..heap import hold_freed_heap, keep_temporaries_on_heap
from ..io import write_atomically
from ..models import available_methods, get_model_class
from ..train import Objective, Shard, adam, run_epoch

__all__ = ["FLOOR_PROTOCOL", "FLOOR_DESCRIPTION", "EPOCH_STEPS", "FloorCase", "FLOOR_CASES", "LINALG_FLOPS",
           "count_flops", "count_flops_by_dtype", "count_work", "floor_seconds", "matmul_rate", "operator_seconds",
           "measure", "floor_table", "run_floor", "random_problem", "trainer_step"]

aten = torch.ops.aten

# the steps of the epoch a minibatch model's step is measured in (the mean step of that epoch): enough that what
# fit does once an epoch weighs about as little as in a real epoch's tens to thousands of steps
EPOCH_STEPS = 8
FLOOR_PROTOCOL = "floor"  # the name `gpscale bench --protocol` knows it by (it is a measurement, not a table)
FLOOR_DESCRIPTION = ("FLOPs of one training step, the posterior fit and one prediction row of every method at a "
                     "small and its paper's size, over this machine's matrix-product rate (no data needed).")


def _last2(shape):
    return shape[-2], shape[-1]


def _batch(shape) -> int:
    return math.prod(shape[:-2])


def _cholesky(A, *args, out_shape=None, **kwargs) -> int:
    m = A[-1]
    return _batch(A) * m**3 // 3


def _triangular_solve(A, B, *args, out_shape=None, left=True, **kwargs) -> int:  # A^{-1} B, or B A^{-1}
    m = A[-1]
    return _batch(B) * m * m * (B[-1] if left else B[-2])


def _cholesky_solve(B, L, *args, out_shape=None, **kwargs) -> int:
    m = L[-1]
    return 2 * _batch(B) * m * m * B[-1]


def _cholesky_inverse(L, *args, out_shape=None, **kwargs) -> int:  # L^{-1}, then L^{-T} L^{-1}
    return _batch(L) * 2 * L[-1] ** 3 // 3


def _lu_solve(A, B, *args, out_shape=None, **kwargs) -> int:  # torch.linalg.solve: LU, then two solves
    m = A[-1]
    k = B[-1] if len(B) == len(A) else 1
    return _batch(A) * (2 * m**3 // 3 + 2 * m * m * k)


def _qr(A, *args, out_shape=None, **kwargs) -> int:  # Householder, R and the reduced Q
    rows, cols = _last2(A)
    k = min(rows, cols)
    return _batch(A) * (4 * rows * cols * k - 2 * (rows + cols) * k * k + 4 * k**3 // 3)


def _eigh(A, *args, out_shape=None, **kwargs) -> int:  # tridiagonalisation and vectors, the usual estimate
    return _batch(A) * 9 * A[-1] ** 3


#: FLOPs of the linear-algebra kernels that torch's counter leaves out, by their textbook counts.
LINALG_FLOPS = {
    aten.linalg_cholesky_ex: _cholesky,
    aten.linalg_solve_triangular: _triangular_solve,
    aten.cholesky_solve: _cholesky_solve,
    aten.cholesky_inverse: _cholesky_inverse,
    aten._linalg_solve_ex: _lu_solve,
    aten.linalg_qr: _qr,
    aten._linalg_eigh: _eigh,
}


#: The in-place forms of products torch's counter knows (``A.addmm_(B, C)`` accumulates a sum of chunks' products
#: in place), by the formulas of their out-of-place forms.
IN_PLACE_PRODUCTS = {aten.addmm_: flop_registry[aten.addmm], aten.baddbmm_: flop_registry[aten.baddbmm]}


class _FlopCounter(TorchDispatchMode):
    """Adds up, per dtype of the result, the FLOPs of every operator it sees that has a formula: torch's own
    (matrix products, convolutions) and :data:`LINALG_FLOPS`, and counts the operators other than views. (torch's
    ``FlopCounterMode`` also tracks modules, which fails on modules called under ``no_grad`` with inputs that
    require gradients.)"""

    def __init__(self):
        super().__init__()
        self.flops: dict[torch.dtype, int] = {}
        self.operators = 0
        self.formulas = {**flop_registry, **IN_PLACE_PRODUCTS,
                         **{op: shape_wrapper(f) for op, f in LINALG_FLOPS.items()}}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.operators += not (func.is_view or func._overloadpacket is aten._unsafe_view)  # reshape's view
        formula = self.formulas.get(func._overloadpacket)
        if formula is not None:
            dtype = (out[0] if isinstance(out, (tuple, list)) else out).dtype
            self.flops[dtype] = self.flops.get(dtype, 0) + int(formula(*args, **kwargs, out_val=out))
        return out


def count_flops(fn) -> int:
    """The FLOPs of calling ``fn()`` once: products as torch counts them plus :data:`LINALG_FLOPS`."""
    return sum(count_flops_by_dtype(fn).values())


def count_flops_by_dtype(fn) -> dict[torch.dtype, int]:
    """:func:`count_flops` split by the dtype each operator computes in (a float32 model's float64 cores apart)."""
    return count_work(fn)[0]


def count_work(fn) -> tuple[dict[torch.dtype, int], int]:
    """:func:`count_flops_by_dtype` of calling ``fn()`` once, and the number of operators it dispatched other
    than views (a view, transpose or reshape that computes nothing)."""
    with _FlopCounter() as counter:
        fn()
    return counter.flops, counter.operators


def floor_seconds(flops: dict[torch.dtype, int], rates: dict[str, float]) -> float:
    """Each dtype's FLOPs at this machine's product rate in that dtype (``rates`` by dtype name; another dtype at
    the slowest rate given)."""
    return sum(f / rates.get(str(dtype).removeprefix("torch."), min(rates.values())) for dtype, f in flops.items())


def best_seconds(fn, repeats: int) -> float:
    """The least wall time of ``repeats`` calls: the one least disturbed by other work."""
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return min(times)


def matmul_rate(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    """This machine's matrix-product rate, FLOP/s: a [size, size] product in ``dtype``, the best of ``repeats``."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=g, dtype=dtype) for _ in range(2))
    a @ b  # warm-up
    return 2 * size**3 / best_seconds(lambda: a @ b, repeats)


def operator_seconds(calls: int = 2000, repeats: int = 5) -> float:
    """The least time of one operator on this machine: the sum of two one-element float32 tensors, called from
    Python, the best of ``repeats`` runs of ``calls`` calls, per call. What any operator costs however little it
    computes (argument parsing, dispatch, the result's allocation)."""
    a, b = torch.ones(1), torch.ones(1)

    def run():
        for _ in range(calls):
            torch.add(a, b)

    run()  # warm-up
    return best_seconds(run, repeats) / calls


@dataclass(frozen=True)
class FloorCase:
    """One method at one size. ``batch_size`` is ignored by full-batch methods (their step is one pass); ``dtype``
    defaults to the one the estimators give the method (its model class's ``auto_dtype``)."""

    method: str
    n: int
    d: int
    options: dict = field(default_factory=dict)
    batch_size: int = 1024
    dtype: str = ""
    size: str = ""  # a name for the size, for the table

    def __post_init__(self):
        if not self.dtype:
            object.__setattr__(self, "dtype", get_model_class(self.method).auto_dtype)


def random_problem(method: str, n: int, d: int, options: dict, dtype: torch.dtype, seed: int = 0):
    """``method`` with ``options``, initialised on n random rows X in [-1, 1]^d with y = sum_j sin(3 x_j) + noise:
    returns (model, X, y, generator)."""
    g = torch.Generator().manual_seed(seed)
    X = 2 * torch.rand(n, d, generator=g, dtype=dtype) - 1
    y = torch.sin(3 * X).sum(1) + 0.1 * torch.randn(n, generator=g, dtype=dtype)
    model = get_model_class(method)(d, **options).to(dtype)
    model.initialise_from_data(X, y, seed=seed)
    return model, X, y, g


def trainer_step(model, generator: torch.Generator, lr: float = 1e-3):
    """``step(X, y, batch_size=None)``: one pass of :func:`gpscale.train.fit`'s own epoch loop over (X, y) in batches
    of ``batch_size`` rows (default: all of them), a natural-gradient step where the model takes one, then an Adam
    step; one process, with fit's malloc thresholds (:mod:`gpscale.heap`; a run of steps under
    :func:`~gpscale.heap.hold_freed_heap` reuses its pages as fit's steps do)."""
    keep_temporaries_on_heap()
    optimiser = adam(model, lr)
    objective = Objective(model)

    def step(X, y, batch_size=None):
        rows = X.shape[0]
        run_epoch(model, objective, X, y, optimiser, generator, batch_size or rows, Shard(0, rows, rows), LOCAL)

    return step


def measure(case: FloorCase, rates: dict[str, float], operator_s: float, repeats: int = 3) -> dict:
    """FLOPs, operators, floors and measured seconds of ``case``'s training step, posterior fit and prediction per
    row; the floor charges each dtype's FLOPs at its own rate in ``rates`` (float32 and float64, by name), the floor
    with operators adds ``operator_s`` (:func:`operator_seconds`) for each operator other than a view.
    A minibatch model's step is the mean of an epoch of ``steps per epoch`` steps (:data:`EPOCH_STEPS`, or as many
    batches as the case's rows hold) in seconds, FLOPs and operators; ``operators`` of the prediction counts its
    whole call (all 1,000 rows), where its seconds and FLOPs are per row."""
    model, X, y, g = random_problem(case.method, case.n, case.d, case.options, getattr(torch, case.dtype))
    rows = X.shape[0] if model.full_batch else min(case.batch_size, X.shape[0])
    # a minibatch model's steps as an epoch of several takes them: what fit does once an epoch (a snapshot of the
    # state to undo it by, the permutation, one read of the summed losses; a natural-gradient model's S^{-1} from
    # q's factor) is shared as in an epoch of EPOCH_STEPS steps, not charged to every step
    steps = 1 if model.full_batch else max(1, min(EPOCH_STEPS, X.shape[0] // rows))
    train_step = trainer_step(model, g)

    def step():
        train_step(X[:rows * steps], y[:rows * steps], rows)

    def posterior():
        with torch.no_grad():
            model.fit_posterior(X, y, LOCAL)

    Xs = X[:1000]

    def predict():
        with torch.no_grad():
            model.predict(Xs)

    out = {"method": case.method, "size": case.size, "n": case.n, "d": case.d, "rows per step": rows,
           "steps per epoch": steps, "dtype": case.dtype, "options": case.options}
    with hold_freed_heap():  # as in fit: each step reuses the pages of the step before it
        step()  # warm-up
        for name, fn, per in (("step", step, steps), ("posterior", posterior, 1), ("predict", predict, Xs.shape[0])):
            model.train(name == "step")  # prediction reads the posterior the phase before it fitted
            by_dtype, operators = count_work(fn)
            flops, floor = sum(by_dtype.values()), floor_seconds(by_dtype, rates)
            with_operators = floor + operators * operator_s
            seconds = best_seconds(fn, repeats)
            out[name] = {"gflop": flops / per / 1e9, "floor_s": floor / per, "seconds": seconds / per,
                         "ratio": seconds / floor if flops else math.inf,
                         "float64 share": by_dtype.get(torch.float64, 0) / flops if flops else 0.0,
                         "operators": operators if name == "predict" else operators / per,
                         "operator floor_s": with_operators / per,
                         "operator ratio": seconds / with_operators if with_operators else math.inf}
    return out


def _cases() -> tuple[FloorCase, ...]:
    """Every registered method at the sizes its class declares (``floor_sizes``: a small one and its paper
    protocol's; a method without a gradient step to time declares none)."""
    return tuple(FloorCase(key, size.n, size.d, dict(size.options), size.batch_size, size=name)
                 for key in available_methods() for name, size in get_model_class(key).floor_sizes.items())


FLOOR_CASES = _cases()


def floor_table(rows: list[dict], rates: dict[str, float], operator_s: float) -> str:
    """The markdown table of :func:`measure`'s rows, with the rates and the operator time they were measured
    against."""
    measured = ", ".join(f"{name} {rate / 1e9:.0f} GFLOP/s" for name, rate in rates.items())
    lines = [f"Matrix-product rate measured in the same run: {measured}; the least time of one operator: "
             f"{operator_s * 1e6:.2g} us.", "",
             "| method | size | n | d | rows per step | dtype | step GFLOP (float64 share) | step floor | step | "
             "x floor | step operators | x floor with operators | posterior GFLOP | x floor | predict MFLOP/row | "
             "x floor |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s, p, q = r["step"], r["posterior"], r["predict"]
        lines.append(f"| {r['method']} | {r['size']} | {r['n']:,} | {r['d']} | {r['rows per step']:,} | "
                     f"{r['dtype']} | {s['gflop']:.3g} ({s['float64 share']:.0%}) | {s['floor_s'] * 1e3:.3g} ms | "
                     f"{s['seconds'] * 1e3:.3g} ms | {s['ratio']:.1f} | {s['operators']:,.0f} | "
                     f"{s['operator ratio']:.1f} | {p['gflop']:.3g} | {p['ratio']:.1f} | "
                     f"{q['gflop'] * 1e3:.3g} | {q['ratio']:.1f} |")
    return "\n".join(lines) + "\n"


def run_floor(out: str | Path, methods: list[str] | None = None, say=print) -> Path:
    """Measure :data:`FLOOR_CASES` (those of ``methods``, or all) and write ``out/floor.md`` and ``out/floor.json``;
    returns the markdown's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cases = [c for c in FLOOR_CASES if methods is None or c.method in methods]
    if not cases:
        raise ValueError(f"no floor case for {', '.join(methods)}; the cases cover "
                         f"{', '.join(sorted({c.method for c in FLOOR_CASES}))}.")
    rates = {name: matmul_rate(getattr(torch, name)) for name in ("float32", "float64")}
    operator_s = operator_seconds()
    rows = []
    for case in cases:
        say(f"{case.method} ({case.size}) ...")
        rows.append(measure(case, rates, operator_s))
    machine = (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
               f"{torch.__version__}, gpscale {__version__}, {time.strftime('%Y-%m-%d')}")
    page = f"# FLOP floor\n\n{machine}.\n\n{floor_table(rows, rates, operator_s)}"
    write_atomically(out / "floor.md", lambda f: f.write(page), text=True)
    table = {"machine": machine, "rates": rates, "operator_s": operator_s, "rows": rows}
    write_atomically(out / "floor.json", lambda f: json.dump(table, f, indent=1), text=True)
    return out / "floor.md"
