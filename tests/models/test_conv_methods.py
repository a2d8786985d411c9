"""The registered convolutional methods, conv-svgp and conv-hvgp: their ELBO is the variational engine's with
convolutional features built by hand from the same kernel; harmonic blocks have the sizes and the independence
of the paper's 2xM and 4xM models; the classifier learns where a square lies in small images; models (and a
ConvKernel given as the kernel) save and load to identical predictions; bad options are refused with the option,
the value and a remedy."""
import numpy as np
import pytest
import torch

from conftest import square_images
import gpscale
from gpscale import GPClassifier, GPRegressor
from gpscale.kernels import RBF, kernel_from_spec, kernel_spec
from gpscale.kernels.patches import (ConvKernel, PatchGeometry, checkerboard_negation, patch_negation,
                                     tick_location_kernel)
from gpscale.models import get_model_class
from gpscale.models.variational.engine import VariationalGP
from gpscale.models.conv.features import ConvolutionalFeatures
from gpscale.models.conv.convgp import patch_median_distance
from gpscale.options import check_options

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64
# --- the ELBO is the engine's ----------------------------------------------------------------------------------
class HandBuilt(VariationalGP):
    """The variational engine on convolutional features built here, not by the registered classes."""

    def __init__(self, features, **kwargs):
        super().__init__(features.kernel.geometry.n_pixels, kernel=features.kernel, **kwargs)
        self.features = features
        self.initialise_q(features.Z.shape[-2], blocks=features.blocks)


def hand_built(group, tick, weights, m, likelihood):
    geometry = PatchGeometry((8, 8), 3)
    location = tick_location_kernel() if tick else None
    kernel = ConvKernel(RBF(9, ard=False, outputscale=5.0), geometry, weights, location)
    action = {None: None, "negation": patch_negation(), "checkerboard": checkerboard_negation(3)}[group]
    classes = {"n_classes": 3} if likelihood == "robustmax" else {}
    return HandBuilt(ConvolutionalFeatures(kernel, m, action), likelihood=likelihood, **classes).double()


@pytest.mark.parametrize("key, group, tick, weights, likelihood", [
    ("conv-svgp", None, True, False, "robustmax"),
    ("conv-svgp", None, False, True, "gaussian"),
    ("conv-hvgp", "negation", True, True, "gaussian"),
    ("conv-hvgp", "checkerboard", True, False, "robustmax"),
])
def test_the_elbo_is_the_engines_with_convolutional_features_built_by_hand(key, group, tick, weights, likelihood):
    X, labels = square_images(12)
    X = torch.tensor(X)
    y = torch.tensor(labels, dtype=F64) if likelihood == "robustmax" else torch.randn(12, dtype=F64)
    options = {"group": group} if group else {}
    classes = {"n_classes": 3} if likelihood == "robustmax" else {}
    model = get_model_class(key)(64, image_shape=(8, 8), filter_size=3, n_inducing=5, tick=tick,
                                 location_weights=weights, likelihood=likelihood, **classes, **options).double()
    model.initialise(X, y, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a q away from the prior, so that every term of the ELBO counts
        model.q_mu.copy_(torch.randn(model.q_mu.shape, generator=g, dtype=F64))
        model.q_sqrt_raw.copy_(torch.eye(5) + 0.1 * torch.randn(model.q_sqrt_raw.shape, generator=g, dtype=F64))
        if weights:
            model.kernel.patch_weights.copy_(0.5 + torch.rand(model.kernel.patch_weights.shape, generator=g))
    reference = hand_built(group, tick, weights, 5, likelihood)
    reference.load_state_dict(model.state_dict())  # strict: the same parameters under the same names
    assert (model.features.blocks or 1) == (reference.features.blocks or 1)
    with torch.no_grad():
        torch.testing.assert_close(model.elbo(X, y, 100), reference.elbo(X, y, 100), rtol=1e-12, atol=1e-12)
        for a, b in zip(model.conditional(X, model.Lu(), model.q_mu, model.q_sqrt),
                        reference.conditional(X, reference.Lu(), reference.q_mu, reference.q_sqrt)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# --- harmonic blocks ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group, T", [("negation", 2), ("checkerboard", 4)])
def test_harmonic_blocks_are_T_by_M_inducing_variables_independent_across_blocks(group, T):
    M = 4
    model = get_model_class("conv-hvgp")(64, image_shape=(8, 8), filter_size=3, n_inducing=M, group=group,
                                         tick=False).double()
    X = torch.tensor(square_images(12)[0])
    model.initialise(X, torch.zeros(12))
    assert model.features.num_inducing == T * M and model.q_mu.shape == (T, M)
    with torch.no_grad():
        Kuu = model.features.Kuu()
        assert Kuu.shape == (T, M, M)
        # brute force: u_t = sum_s W[t, s] g(G^s z_t), so Cov(u_t, u_t') = sum_{s, s'} W[t, s] W[t', s'] k(G^s z_t,
        # G^s' z_t'): zero across blocks, Kuu[t] within
        action, Z, k = model.features.action, model.features.Z, model.kernel.patch_kernel
        W = action.weights(F64)
        orbits = [torch.stack([action.apply(Z[t], s) for s in range(action.order)]) for t in range(T)]  # [S, M, d]
        for t in range(T):
            for u in range(T):
                C = sum(W[t, s] * W[u, r] * k(orbits[t][s], orbits[u][r])
                        for s in range(action.order) for r in range(action.order))
                torch.testing.assert_close(C, Kuu[t] if t == u else torch.zeros(M, M, dtype=F64),
                                           rtol=1e-10, atol=1e-12)
    if group == "negation":  # block 0 the even part of g, block 1 the odd part
        z = Z[0, :1]
        with torch.no_grad():
            torch.testing.assert_close(Kuu[0, :1, :1], (k(z, z) + k(z, -z)) / 2)
            torch.testing.assert_close(Kuu[1, :1, :1], (k(z, z) - k(z, -z)) / 2)


# --- the estimators ---------------------------------------------------------------------------------------------
def classifier(method, **options):
    settings = dict(image_shape=(8, 8), filter_size=3, n_inducing=8, epochs=25, batch_size=20, lr=0.05, seed=0,
                    progress=False)
    return GPClassifier(method=method, **{**settings, **options})


@pytest.mark.parametrize("method", ["conv-svgp", "conv-hvgp"])
def test_a_classifier_learns_where_the_square_is_and_saves(tmp_path, method):
    X, labels = square_images(60)
    names = np.array(["top left", "top right", "bottom left"])[labels]
    options = {"n_inducing": 4} if method == "conv-hvgp" else {}
    clf = classifier(method, **options).fit(X, names)
    assert clf.model_.likelihood.__class__.__name__.lower().startswith("robust")
    assert (clf.predict(X) == names).mean() >= 0.9
    X_test, test_labels = square_images(30, seed=1)
    assert (clf.predict(X_test) == np.array(["top left", "top right", "bottom left"])[test_labels]).mean() >= 0.9
    clf.save(tmp_path / "clf.gps")
    loaded = gpscale.load(tmp_path / "clf.gps")
    np.testing.assert_array_equal(loaded.predict_proba(X_test), clf.predict_proba(X_test))
    assert loaded.get_params() == clf.get_params()


def test_two_classes_take_the_probit_likelihood_and_a_regressor_fits_images():
    X, labels = square_images(45)
    two = classifier("conv-svgp", epochs=15).fit(X[labels < 2], labels[labels < 2])
    assert type(two.model_.likelihood).__name__ == "Bernoulli"
    assert (two.predict(X[labels < 2]) == labels[labels < 2]).mean() >= 0.9
    y = np.where(labels == 0, 1.0, -1.0)  # is the square top left?
    reg = GPRegressor(method="conv-svgp", image_shape=(8, 8), filter_size=3, n_inducing=8, epochs=25, batch_size=15,
                      lr=0.05, progress=False).fit(X, y)
    assert reg.score(X, y) > 0.8


def test_a_conv_kernel_object_saves_as_a_spec_and_loads_to_identical_predictions(tmp_path):
    geometry = PatchGeometry((8, 8), 3)
    kernel = ConvKernel(RBF(9, ard=False, lengthscale=2.0), geometry, location_weights=True,
                        location_kernel=tick_location_kernel())
    spec = kernel_spec(kernel)
    rebuilt = kernel_from_spec(spec)
    assert isinstance(rebuilt, ConvKernel) and rebuilt.geometry == geometry and rebuilt.tick
    assert rebuilt.location_weights and rebuilt.config()["geometry"] == geometry.config()
    rebuilt.load_state_dict(kernel.state_dict())
    X = torch.tensor(square_images(5)[0], dtype=torch.float32)
    torch.testing.assert_close(rebuilt(X, X), kernel(X, X), rtol=0, atol=0)
    data, labels = square_images(30)
    clf = classifier("conv-svgp", kernel=kernel, location_weights=True, epochs=3).fit(data, labels)
    clf.save(tmp_path / "clf.gps")
    loaded = gpscale.load(tmp_path / "clf.gps")
    assert isinstance(loaded.model_.kernel, ConvKernel) and loaded.model_.kernel.location_weights
    np.testing.assert_array_equal(loaded.predict_proba(data), clf.predict_proba(data))


def test_the_median_heuristic_runs_on_patches_and_skips_identical_ones():
    geometry = PatchGeometry((4, 4), 2)
    X = torch.zeros(10, 16, dtype=F64)
    X[::2, :] = torch.arange(16, dtype=F64)  # half the images blank: their patches are all the same
    patches, _ = geometry.sample(X, 1000, 0)
    distances = torch.nn.functional.pdist(patches)
    assert (distances == 0).double().mean() > 0.25  # many identical pairs, which would pull the median down
    assert patch_median_distance(X, geometry) == pytest.approx(distances[distances > 0].median().item())
    model = get_model_class("conv-svgp")(16, image_shape=(4, 4), filter_size=2, n_inducing=3).double()
    assert model.start_lengthscale_at_median()
    model.initialise(X, torch.zeros(10))
    assert model.kernel.patch_kernel.lengthscale.item() == pytest.approx(patch_median_distance(X, geometry))


# --- options ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options, message", [
    ({"image_shape": (8, 7)}, r"image_shape=\(8, 7\) does not hold the n_features = 64 columns"),
    ({"image_shape": (4, 4, 3)}, r"image_shape=\(4, 4, 3\) does not hold the n_features = 64 columns"),
    ({"filter_size": 9}, r"filter_size=9, stride=1 and padding='valid' do not fit the 8 x 8 images.*padding='same'"),
    ({"filter_size": 0}, r"filter_size \(.*\) must be an integer >= 1 \(or a \(height, width\) pair"),
    ({"padding": "full"}, r"padding must be one of \('valid', 'same'\), got 'full'"),
    ({"tick": "yes"}, r"tick must be True or False"),
    ({"kernel": RBF(4)}, r"the patch kernel acts on 4 inputs, but a \(3, 3\) patch of 1 channel\(s\) has 9"),
    ({"kernel": ConvKernel(RBF(9), PatchGeometry((8, 8), 3))},
     r"the ConvKernel given has tick=False but the options give tick=True"),
])
def test_bad_options_are_refused_with_the_option_and_a_remedy(options, message):
    X, labels = square_images(12)
    with pytest.raises(ValueError, match=message):
        classifier("conv-svgp", epochs=1, **options).fit(X, labels)


def test_square_single_channel_images_need_no_image_shape_and_others_name_it():
    from gpscale.models.conv.from_options import resolve_image_shape

    assert resolve_image_shape(None, 784, "conv-hvgp") == (28, 28, 1)
    X, labels = square_images(12)  # 8 x 8
    assert classifier("conv-svgp", epochs=1, image_shape=None).fit(X, labels).model_.image_shape == (8, 8, 1)
    with pytest.raises(ValueError, match=r"conv-svgp needs image_shape=\(H, W\) or \(H, W, C\).*got none, and the "
                                         r"n_features = 48 columns of X are not the pixels of a square"):
        classifier("conv-svgp", epochs=1, image_shape=None).fit(X[:, :48], labels)


def test_bad_harmonic_options_are_refused():
    X, labels = square_images(12)
    with pytest.raises(ValueError, match=r"group must be one of \('negation', 'checkerboard'\).*got 'rotation'"):
        classifier("conv-hvgp", group="rotation").fit(X, labels)
    with pytest.raises(ValueError, match=r"group='checkerboard' splits a patch's pixels in two.*group='negation'"):
        classifier("conv-hvgp", group="checkerboard", filter_size=1).fit(X, labels)


def test_filter_size_and_stride_take_an_int_or_a_pair_at_the_front_door():
    check_options({"filter_size": (1, 2), "stride": 2})
    with pytest.raises(ValueError, match=r"stride \(.*\) must be .*got \(0, 2\)"):
        check_options({"stride": (0, 2)})
    with pytest.raises(ValueError, match=r"filter_size \(.*\) must be .*got \(1, 2, 3\)"):
        check_options({"filter_size": (1, 2, 3)})


def test_an_image_side_of_minus_one_is_inferred_from_the_columns():
    model = get_model_class("conv-svgp")(12, image_shape=(2, -1, 3), filter_size=2, n_inducing=3)
    assert model.image_shape == (2, 2, 3) and model.kernel.geometry.patch_dim == 12
    with pytest.raises(ValueError, match=r"image_shape=\(5, -1\) does not hold the n_features = 12 columns"):
        get_model_class("conv-svgp")(12, image_shape=(5, -1), filter_size=2)
