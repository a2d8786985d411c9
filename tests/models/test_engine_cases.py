"""Every method on the variational and the linear engine, against the engines' dense formulas
(:mod:`engine_cases`): one small concrete class per registered method (and per parametrisation of q)."""
import torch

from engine_cases import F64, LinearEngineCase, VariationalEngineCase
from gpscale.models import get_model_class

IMAGE = (5, 5)  # single-channel images for the convolutional methods: 25 inputs, 3 x 3 patches


def regression_data(n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=F64)
    y = torch.sin(5 * X[:, 0]) + X[:, -1] + 0.1 * torch.randn(n, generator=g, dtype=F64)
    return X, y


class Variational(VariationalEngineCase):
    """A registered method, ``options`` its constructor's, on regression data of ``d`` inputs."""

    key, d, options = None, 2, {}

    def make_model(self, **options):
        X, y = regression_data(self.rows, self.d)
        model = get_model_class(self.key)(self.d, noise=0.1, **self.options, **options).double()
        model.initialise_from_data(X, y)
        return model, X, y


class TestSVGP(Variational):
    key, options = "svgp", {"n_inducing": 5, "lengthscale": 0.4}


class TestUnwhitenedSVGP(Variational):
    key, options = "svgp", {"n_inducing": 5, "lengthscale": 0.4, "whiten": False}


class TestODVGP(Variational):
    key, options = "odvgp", {"n_inducing": 5, "n_mean_inducing": 6, "lengthscale": 0.4}


class TestODVFF(Variational):
    key, options = "odvff", {"n_frequencies": 3, "n_mean_inducing": 6, "lengthscale": 0.3}


class TestVFFSVGP(Variational):
    key, options = "vff-svgp", {"n_frequencies": 3, "lengthscale": 0.3}


class TestHVGP(Variational):
    key, options = "hvgp", {"n_inducing": 4, "group": "negation", "kernel": "rbf"}


class TestConvSVGP(Variational):
    key, d, options = "conv-svgp", IMAGE[0] * IMAGE[1], {"image_shape": IMAGE, "filter_size": 3, "n_inducing": 4}


class TestConvHVGP(Variational):
    key, d = "conv-hvgp", IMAGE[0] * IMAGE[1]
    options = {"image_shape": IMAGE, "filter_size": 3, "n_inducing": 4, "group": "negation"}


class TestDeepConvHVGP(Variational):
    """One layer: the output layer alone, whose q is the engine's (hidden layers add draws and their own KLs)."""

    key, d = "deep-conv-hvgp", IMAGE[0] * IMAGE[1]
    options = {"image_shape": IMAGE, "n_layers": 1, "filter_sizes": (3,), "strides": (1,), "n_inducing": 4}


class TestSVDBK(Variational):
    key, options = "svdbk", {"n_basis": 4, "network": "mlp", "width": 8, "correction": False}

    def inputs(self, model, X):
        return model.kernel.basis(X)


class Linear(LinearEngineCase):
    key, d, rows, options = None, 2, 20, {}

    def make_model(self):
        X, y = regression_data(self.rows, self.d)
        model = get_model_class(self.key)(self.d, noise=0.1, **self.options).double()
        model.initialise_from_data(X, y)
        return model, X, y


class TestSGPR(Linear):
    key, options = "sgpr", {"n_inducing": 5, "lengthscale": 0.4}


class TestVFF(Linear):
    key, options = "vff", {"n_frequencies": 3, "lengthscale": 0.3}


class TestSoftKI(Linear):
    key, options = "softki", {"n_inducing": 6, "calibrate_noise": None, "lengthscale": 0.4}


class TestGRIEF(Linear):
    key, options = "grief", {"n_eigen": 8, "grid_size": 4, "init_exact_points": 0, "lengthscale": 0.4}


class TestDBK(Linear):
    key, options = "dbk", {"n_basis": 4, "network": "mlp", "width": 8, "calibrate_noise": None,
                           "correction": False}
