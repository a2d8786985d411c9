"""Redraw a paper's figures from synthetic experiments: ``python -m experiments.figures <figure> --out DIR``.

Run from the repository's root with gpscale installed (``make install``) and matplotlib (``pip install
'gpscale[bench]'``). Every figure's defaults are its paper's settings; ``--help`` after a figure's name lists the
smaller ones. The scripts use gpscale's public modules (models, kernels, training) and are not installed with it.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from pathlib import Path


def names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def ints(text: str) -> list[int]:
    try:
        return [int(t) for t in names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.figures",
                                     description="Redraw a paper's figures from synthetic experiments.")
    sub = parser.add_subparsers(title="figures")
    q = sub.add_parser("dbk", help="Deep Basis Kernel paper, Figs. 1 and 3 (1-D synthetic data)",
                           description="Defaults are the paper's settings (hours on a CPU for Fig. 3); see "
                                       "docs/dbk.md for smaller ones.")
    out_option(q)
    q.add_argument("--only", choices=["fig1", "fig3"], default=None, help="draw one figure (default: both)")
    q.add_argument("--n", type=int, default=None, help="Fig. 1 training points (default 1000)")
    q.add_argument("--sizes", type=ints, default=None, help="Fig. 3 training sizes (default 100,1000,10000,100000)")
    q.add_argument("--seeds", type=int, default=None, help="Fig. 3 seeds per size (default 10)")
    q.add_argument("--n-test", type=int, default=None, help="test points (default 1000)")
    q.add_argument("--exact-max-n", type=int, default=None, help="largest n for the exact GP in Fig. 3 (default 10000)")
    q.add_argument("--iterations", type=int, default=None, help="full-batch Adam steps (default 10000)")
    q.add_argument("--lr", type=float, default=None, help="Adam learning rate (default 1e-3)")
    q.add_argument("--n-basis", type=int, default=None, help="DBK's r (default 128)")
    q.add_argument("--width", type=int, default=None, help="hidden units of DBK's MLP (default 128)")
    q.add_argument("--scale-basis", action="store_true", default=None,
                   help="divide DBK's network output by sqrt(r) (not the paper's; see docs/dbk.md)")
    q.add_argument("--dtype", choices=["float64", "float32"], default=None, help="default float64")
    q.add_argument("--device", default=None, help="default cpu")
    q.set_defaults(run=figures_dbk)
    q = sub.add_parser("grief", help="GP-GRIEF paper, Fig. 2 (kernel reconstruction, d = 100)",
                           description="Defaults are the paper's settings (about 6 minutes on a CPU); the SE "
                                       "lengthscale sqrt(d) is an assumption. See docs/grief.md.")
    out_option(q)
    q.add_argument("--n", type=int, default=None, help="points in all, half of them training points (default 5000)")
    q.add_argument("--d", type=int, default=None, help="input dimension (default 100)")
    q.add_argument("--repeats", type=int, default=None, help="independent draws averaged (default 10)")
    q.add_argument("--p", type=ints, default=None,
                   help="numbers of basis functions (default 10,20,50,100,200,500,1000)")
    q.add_argument("--grid-size", type=int, default=None, help="GRIEF's grid points per dimension (default 100)")
    q.add_argument("--lengthscale", type=float, default=None, help="SE lengthscale (default sqrt(d))")
    q.add_argument("--seed", type=int, default=None, help="default 0")
    q.set_defaults(run=figures_grief)
    q = sub.add_parser("odvff-banana", help="ODVFF paper, Fig. 4 (probit classification, ODVFF vs SVGP)",
                           description="Two moons stand in for the paper's banana set (about a minute on a CPU); "
                                       "see docs/odvff.md.")
    out_option(q)
    q.add_argument("--n-train", type=int, default=None, help="training points (default 400)")
    q.add_argument("--epochs", type=int, default=None, help="epochs of batch 100 (default 300)")
    q.add_argument("--n-frequencies", type=int, default=None, help="ODVFF's F per dimension (default 6)")
    q.add_argument("--seed", type=int, default=None, help="default 0")
    q.set_defaults(run=figures_from("odvff_figures", "banana_figure", "BananaSettings"))
    q = sub.add_parser("odvff-1d", help="ODVFF paper, Figs. 1 and 2 (1-D GP draw with a gap; |beta| sweep)",
                           description="Defaults: 2000 points, 3 draws, 2000 minibatch iterations per model (tens "
                                       "of minutes on a CPU); see docs/odvff.md.")
    out_option(q)
    q.add_argument("--n-train", type=int, default=None, help="training points (default 2000)")
    q.add_argument("--repeats", type=int, default=None, help="GP draws (default 3)")
    q.add_argument("--epochs", type=int, default=None, help="ODVFF epochs of batch 500 (default 500)")
    q.add_argument("--betas", type=ints, default=None, help="|beta| values (default 21,61,101,141,181)")
    q.add_argument("--seed", type=int, default=None, help="default 0")
    q.set_defaults(run=figures_from("odvff_figures", "figures_1d", "OneDSettings"))
    q = sub.add_parser("odvff-nonstationary", help="ODVFF paper, Fig. 3 (Matérn + periodic, App. C)",
                           description="1000 training and 3000 test points; ODVFF with an extra periodic component "
                                       "against the exact GP (minutes on a CPU); see docs/odvff.md.")
    out_option(q)
    q.add_argument("--n-train", type=int, default=None, help="training points (default 1000)")
    q.add_argument("--n-test", type=int, default=None, help="test points (default 3000)")
    q.add_argument("--epochs", type=int, default=None, help="ODVFF epochs of batch 250 (default 500)")
    q.add_argument("--seed", type=int, default=None, help="default 0")
    q.set_defaults(run=figures_from("odvff_figures", "nonstationary_figure", "NonstationarySettings"))
    q = sub.add_parser("hvgp-samples", help="HVGP paper, Fig. 1 (sub-process samples of a 2-D RBF, 90° turns)",
                           description="One draw split into its sub-processes, direct draws of each sub-kernel, and "
                                       "the checks of the decomposition (seconds on a CPU); see docs/hvgp.md.")
    out_option(q)
    q.add_argument("--grid-size", type=int, default=None, help="grid points per side (default 40)")
    q.add_argument("--lengthscale", type=float, default=None, help="RBF lengthscale (default 0.5)")
    q.add_argument("--seed", type=int, default=None, help="default 0")
    q.set_defaults(run=figures_from("hvgp_figures", "samples_figure", "SamplesSettings"))
    q = sub.add_parser("hvgp-toy", help="HVGP paper, Fig. 9 (1-D toy, x -> -x: even and odd sub-GPs)",
                           description="HVGP 2 x 5 against SVGP 5 and 10 on a generated Snelson-like set (under a "
                                       "minute on a CPU); see docs/hvgp.md.")
    out_option(q)
    q.add_argument("--n-train", type=int, default=None, help="training points (default 200)")
    q.add_argument("--epochs", type=int, default=None, help="full-batch Adam steps (default 1000)")
    q.add_argument("--n-inducing", type=int, default=None, help="inducing points per sub-GP (default 5)")
    q.add_argument("--seed", type=int, default=None, help="default 0")
    q.set_defaults(run=figures_from("hvgp_figures", "toy_figure", "ToySettings"))
    q = sub.add_parser("hvgp-nystrom", help="HVGP paper, Fig. 6 (Nyström trace error: SVGP vs HVGP 8 x M)",
                           description="Relative trace error on 3000 points against M, PCA against axis negation "
                                       "(under a minute on a CPU); kin40k is added where $GPSCALE_DATA holds it. "
                                       "See docs/hvgp.md.")
    out_option(q)
    q.add_argument("--n", type=int, default=None, help="points (default 3000)")
    q.add_argument("--inducing", type=ints, default=None, help="values of M (default 8,16,32,64,128)")
    q.add_argument("--n-ways", type=int, default=None, help="negation ways J, 2^J blocks (default 3)")
    q.add_argument("--datasets", type=names, default=None, help="default synthetic,kin40k")
    q.add_argument("--seed", type=int, default=None, help="default 0")
    q.set_defaults(run=figures_from("hvgp_figures", "nystrom_figure", "NystromSettings"))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    try:
        args.run(args)
    except (ValueError, OSError, RuntimeError) as err:  # bad settings: one line, as the gpscale command does
        print(f"figures: error: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}",
              file=sys.stderr)
        return 1
    return 0


def figures_dbk(args) -> None:
    from .dbk_figures import Training, make_figures

    def given(*names):  # only what was given, so that the defaults live in one place: dbk_figures
        return {name: getattr(args, name) for name in names if getattr(args, name) is not None}

    training = Training(**given("iterations", "lr", "n_basis", "width", "scale_basis", "dtype", "device"))
    settings = given("n", "seeds", "n_test", "exact_max_n")
    if args.sizes is not None:
        settings["sizes"] = tuple(args.sizes)
    for path in make_figures(args.out, only=args.only, training=training, **settings):
        print(f"wrote {path}")


def figures_grief(args) -> None:
    from .grief_figures import FILE_STEM, figure2

    settings = {name: getattr(args, name) for name in ("n", "d", "repeats", "grid_size", "lengthscale", "seed")
                if getattr(args, name) is not None}  # only what was given: the defaults live in grief_figures
    if args.p is not None:
        settings["ps"] = tuple(args.p)
    figure2(args.out, **settings)
    for suffix in (".png", ".json"):
        print(f"wrote {args.out / (FILE_STEM + suffix)}")


def figures_from(module: str, draw: str, settings: str):
    """The run function of a figure drawn by ``experiments.<module>``: the options given on the command line
    (lists as tuples) become fields of ``<module>.<settings>``, whose defaults stand for the others, and
    ``<module>.<draw>`` writes the files."""

    def run(args) -> None:
        figures = importlib.import_module(f".{module}", __package__)
        cls = getattr(figures, settings)
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
                 if getattr(args, f.name, None) is not None}
        given = {name: tuple(v) if isinstance(v, list) else v for name, v in given.items()}
        for path in getattr(figures, draw)(args.out, cls(**given)):
            print(f"wrote {path}")

    return run


def out_option(parser) -> None:
    parser.add_argument("--out", type=Path, default=Path("docs/figures"), help="output folder (default: docs/figures)")


if __name__ == "__main__":
    sys.exit(main())
