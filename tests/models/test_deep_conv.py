"""deep-conv-hvgp, the deep convolutional GP: one layer is the single-layer conv model; the hidden layers' matrix-normal
KL is the dense Gaussian KL; a hidden layer's mean is its input through the identity filter (a convolution computed
here by torch); the doubly stochastic ELBO estimator is unbiased for the ELBO computed by brute-force sampling of
every layer's inducing outputs; the draws of a row depend on the row alone; a 2-layer classifier learns where a
square lies and saves; bad options are refused with the option and a remedy."""
import math

import numpy as np
import pytest
import torch
from conftest import square_images
from torch.nn import functional

import gpscale
from gpscale import GPClassifier
from gpscale.models import get_model_class
from gpscale.models.conv import hashed_draws
from gpscale.models.conv.deep_conv import matrix_normal_kl
from gpscale.models.conv.hashed_draws import row_noise

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64
DEEP = get_model_class("deep-conv-hvgp")


def lower(*shape, g, diagonal=0.5):
    """A random lower-triangular factor [..., m, m] with a positive diagonal of about ``diagonal``."""
    L = torch.tril(0.3 * torch.randn(*shape, generator=g, dtype=F64), -1)
    return L + torch.diag_embed(diagonal * (0.5 + torch.rand(*shape[:-1], generator=g, dtype=F64)))


@torch.no_grad()
def randomise(model, g):
    """Every q away from its start, so that no term of the ELBO is trivially zero."""
    for layer in getattr(model, "hidden", ()):
        layer.q_mu.copy_(0.5 * torch.randn(layer.q_mu.shape, generator=g, dtype=F64))
        layer.q_in_sqrt_raw.copy_(lower(*layer.q_in_sqrt_raw.shape, g=g))
        layer.q_out_sqrt_raw.copy_(lower(*layer.q_out_sqrt_raw.shape, g=g))
    model.q_mu.copy_(0.5 * torch.randn(model.q_mu.shape, generator=g, dtype=F64))
    model.q_sqrt_raw.copy_(lower(*model.q_sqrt_raw.shape, g=g))


# --- one layer is the single-layer model -------------------------------------------------------------------------
@pytest.mark.parametrize("key, group", [("conv-hvgp", "checkerboard"), ("conv-hvgp", "negation"), ("conv-svgp", None)])
def test_one_layer_is_the_single_layer_conv_model(key, group):
    X, labels = square_images(12)
    X, y = torch.tensor(X, dtype=F64), torch.tensor(labels, dtype=F64)
    options = dict(image_shape=(8, 8), n_inducing=5, likelihood="robustmax", n_classes=3)
    shallow = get_model_class(key)(64, filter_size=3, **options, **({"group": group} if group else {})).double()
    shallow.initialise(X, y)
    randomise(shallow, torch.Generator().manual_seed(0))
    deep = DEEP(64, n_layers=1, filter_sizes=(3,), strides=(1,), group=group, **options).double()
    deep.load_state_dict(shallow.state_dict())  # the same names: one layer holds exactly the shallow model
    with torch.no_grad():
        torch.testing.assert_close(deep.elbo(X, y, 100), shallow.elbo(X, y, 100), rtol=1e-13, atol=0)
        shallow.fit_posterior(X, y)
        deep.fit_posterior(X, y)
        for a, b in zip(deep.predict(X), shallow.predict(X)):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)


# --- the hidden layers' q -----------------------------------------------------------------------------------------
def test_the_matrix_normal_kl_is_the_dense_gaussian_kl_of_its_kronecker_covariance():
    g = torch.Generator().manual_seed(1)
    T, M, C = 3, 4, 2
    mu, L_in, L_out = torch.randn(T, M, C, generator=g, dtype=F64), lower(T, M, M, g=g), lower(T, C, C, g=g)
    dense = 0.0
    for t in range(T):  # vec stacks the columns: Cov(vec V) = Sigma_o (x) Sigma_i
        cov = torch.kron(L_out[t] @ L_out[t].T, L_in[t] @ L_in[t].T)
        q = torch.distributions.MultivariateNormal(mu[t].T.reshape(-1), covariance_matrix=cov)
        p = torch.distributions.MultivariateNormal(torch.zeros(M * C, dtype=F64), torch.eye(M * C, dtype=F64))
        dense += torch.distributions.kl_divergence(q, p)
    torch.testing.assert_close(matrix_normal_kl(mu, L_in, L_out), dense, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("channels", [1, 3])
def test_a_hidden_layer_starts_at_its_input_through_the_identity_filter(channels):
    rng = np.random.default_rng(2)
    X = torch.tensor(rng.standard_normal((4, 6 * 6 * 2)), dtype=F64)  # 6 x 6 images of 2 channels
    model = DEEP(72, image_shape=(6, 6, 2), filter_sizes=(3, 2), strides=(1, 1), hidden_channels=channels,
                 hidden_inducing=4, n_inducing=4).double()
    model.initialise(X, torch.zeros(4, dtype=F64))
    layer = model.hidden[0]
    with torch.no_grad():
        mean, _, _ = layer.moments(layer.patches(X))  # q_mu = 0 at the start: the GPs add nothing to the mean
    # the reference: torch's convolution with a filter that is 1 at the centre pixel, channel c to channel c
    weight = torch.zeros(channels, 2, 3, 3, dtype=F64)
    for c in range(min(channels, 2)):
        weight[c, c, 1, 1] = 1.0
    expected = functional.conv2d(X.reshape(4, 6, 6, 2).permute(0, 3, 1, 2), weight)  # [n, C, 4, 4]
    torch.testing.assert_close(mean.reshape(4, 4, 4, channels), expected.permute(0, 2, 3, 1), rtol=0, atol=0)
    # and q's part of the draws' covariance starts near 0 (Sigma_o's factor at 1e-5 I): the Nyström residual remains
    with torch.no_grad():
        _, variance, _ = layer.moments(layer.patches(X))
        assert variance.max() * (layer.q_out_sqrt @ layer.q_out_sqrt.mT).abs().max() < 1e-9


# --- the doubly stochastic ELBO is unbiased -----------------------------------------------------------------------
def brute_force_elbo(model, X, y, draws, g):
    """E_q log p(y | f) - KL by sampling every layer's inducing outputs from q and f from the prior's conditional,
    with dense matrices: for each image location of a hidden layer, V_t ~ N(vec Mu_t, Sigma_o (x) Sigma_i) (its own
    draw: a hidden layer's output is independent across locations), U_t = L_t V_t, and
    f = m(x^[p]) + sum_t k_t(Z_t, x^[p])^T K_t^{-1} U_t + (k(x^[p], x^[p]) - sum_t Q_t)^{1/2} e; at the output
    u_t = L_t v_t with v_t ~ q and f(x) = sum_t Kuf_t^T K_t^{-1} u_t + (k(x, x) - sum_t Q_t)^{1/2} e. Returns the
    per-draw sums over images of log p(y | f) [draws] and the KL."""
    n = X.shape[0]
    H = X.repeat(draws, 1)  # [draws n, D]
    kl = 0.0
    for layer in model.hidden:
        geometry, C, T = layer.geometry, layer.channels, layer.blocks
        patches = geometry.extract(H).reshape(-1, geometry.patch_dim)  # [r, d], r = draws n P
        r, M = patches.shape[0], layer.q_mu.shape[-2]
        fh, fw = geometry.filter
        centre = ((fh // 2) * fw + fw // 2) * geometry.channels
        f = torch.zeros(r, C, dtype=F64)
        f[:, :min(C, geometry.channels)] = patches[:, centre:centre + min(C, geometry.channels)]
        Kuu = layer.features.Kuu().reshape(T, M, M) + layer.jitter * torch.eye(M, dtype=F64)
        Kuf = layer.features.Kuf(patches).reshape(T, M, r)
        residual = layer.features.Kff_diag(patches)
        for t in range(T):
            L_in, L_out = layer.q_in_sqrt[t], layer.q_out_sqrt[t]
            cov = torch.kron(L_out @ L_out.T, L_in @ L_in.T)  # [C M, C M], column-stacked vec V
            vec = torch.distributions.MultivariateNormal(layer.q_mu[t].T.reshape(-1), covariance_matrix=cov)
            V = vec.sample((r,)).reshape(r, C, M).transpose(1, 2)  # one V_t per location, [r, M, C]
            U = torch.linalg.cholesky(Kuu[t]) @ V
            alpha = torch.linalg.solve(Kuu[t], Kuf[t])  # K_t^{-1} k_t(Z_t, x) [M, r]
            f += torch.einsum("mr,rmc->rc", alpha, U)
            residual = residual - (Kuf[t] * alpha).sum(0)
            p = torch.distributions.MultivariateNormal(torch.zeros(M * C, dtype=F64), torch.eye(M * C, dtype=F64))
            kl += torch.distributions.kl_divergence(vec, p)
        f += residual.clamp_min(0).sqrt().unsqueeze(-1) * torch.randn(r, C, generator=g, dtype=F64)
        H = f.reshape(draws * n, -1)
    T, M = model.features.blocks, model.q_mu.shape[-1]
    Kuu = model.features.Kuu().reshape(T, M, M) + model.jitter * torch.eye(M, dtype=F64)
    Kuf = model.features.Kuf(H).reshape(T, M, -1)
    f, residual = torch.zeros(draws * n, dtype=F64), model.features.Kff_diag(H)
    for t in range(T):
        q = torch.distributions.MultivariateNormal(model.q_mu[t], scale_tril=model.q_sqrt[t])
        u = torch.linalg.cholesky(Kuu[t]) @ q.sample((draws * n,)).T  # a u per image and draw, [M, draws n]
        alpha = torch.linalg.solve(Kuu[t], Kuf[t])
        f += (alpha * u).sum(0)
        residual = residual - (Kuf[t] * alpha).sum(0)
        kl += torch.distributions.kl_divergence(q, torch.distributions.MultivariateNormal(
            torch.zeros(M, dtype=F64), torch.eye(M, dtype=F64)))
    f += residual.clamp_min(0).sqrt() * torch.randn(draws * n, generator=g, dtype=F64)
    noise = model.likelihood.noise
    log_p = -0.5 * (torch.log(2 * torch.pi * noise) + (y.repeat(draws) - f) ** 2 / noise)
    return log_p.reshape(draws, n).sum(1), kl


@torch.no_grad()
def test_the_doubly_stochastic_elbo_is_unbiased_for_the_brute_force_elbo():
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)  # the samplers of torch.distributions
    X = torch.randn(3, 16, generator=g, dtype=F64)  # three 4 x 4 images
    y = torch.randn(3, generator=g, dtype=F64)
    model = DEEP(16, image_shape=(4, 4), filter_sizes=(2, 2), strides=(1, 1), hidden_channels=2, hidden_inducing=3,
                 n_inducing=3, group="negation", noise=0.3, lengthscale=1.5, outputscale=1.0).double()
    model.initialise(X, y)
    randomise(model, g)
    for layer in model.hidden:
        layer.features.Z.add_(0.3 * torch.randn(layer.features.Z.shape, generator=g, dtype=F64))
    # the estimator: batches of 400 draws, each batch's mean one estimate of the ELBO
    model.train_samples = 400
    estimates = torch.stack([model.elbo(X, y, num_data=3) for _ in range(25)])
    log_p, kl = brute_force_elbo(model, X, y, 10_000, g)
    reference = log_p.mean() - kl
    error = (estimates.var() / len(estimates) + log_p.var() / len(log_p)).sqrt()
    assert abs(estimates.mean() - reference) < 4 * error, (estimates.mean(), reference, error)
    assert error < 0.02 * abs(reference)  # a test with power: the MC error is small beside the ELBO
    # the KLs alone: the estimator's are the dense Gaussian KLs of the reference
    torch.testing.assert_close(model.hidden_kl() + model.prior_kl(), kl, rtol=1e-10, atol=1e-10)


def test_a_rows_draws_depend_on_the_row_alone():
    X = torch.randn(5, 7, generator=torch.Generator().manual_seed(4), dtype=F64)
    noise = row_noise(X, 11, 6)
    torch.testing.assert_close(row_noise(X[[3, 1]], 11, 6), noise[[3, 1]], rtol=0, atol=0)
    torch.testing.assert_close(row_noise(X.float(), 11, 6), noise, rtol=0, atol=0)  # float32 draws alike
    assert not torch.equal(row_noise(X, 12, 6), noise)  # another key, other draws


def test_the_hash_is_its_definition_mod_the_prime_where_an_xor_shift_lands_on_the_prime():
    """_mix takes the xor-shifts mod the prime by one comparison at its end (a shift of a residue is at most the
    prime itself, and the next round's product reads the prime as 0): equal to the definition with ``% prime``
    after every step, on random residues and on inputs whose xor-shift in one of the rounds is the prime exactly
    (found by running the rounds backwards from 2,147,418,113, whose shift is 2^31 - 1)."""
    prime, rounds = hashed_draws.PRIME, hashed_draws._ROUNDS

    def definition(x):
        for a in rounds:
            x = (x * a + 12345) % prime
            x = (x ^ (x >> 15)) % prime
        return x

    def input_whose_round_lands(last: int) -> int:  # rounds 0..last, the last one's shift landing on the prime
        x = (2_147_418_113 - 12345) * pow(rounds[last], -1, prime) % prime
        for a in reversed(rounds[:last]):
            unshifted = x ^ (x >> 15) ^ (x >> 30)  # the xor-shift's inverse on 31 bits
            x = (unshifted - 12345) * pow(a, -1, prime) % prime
        return x

    landing = [input_whose_round_lands(k) for k in range(len(rounds))]
    for k, x in enumerate(landing):
        for a in rounds[:k + 1]:
            residue = (x * a + 12345) % prime
            x = residue ^ (residue >> 15)
        assert x == prime  # its shift in round k is the prime
    x = torch.cat([torch.randint(0, prime, (10_000,), generator=torch.Generator().manual_seed(6)),
                   torch.tensor([0, 1, prime - 1, *landing])])
    assert torch.equal(hashed_draws._mix(x), definition(x))


def _row_noise_by_definition(X, key, size):
    """row_noise as defined: the hash with ``% prime`` after every step, [n, 2 size] uniforms in one block, then
    Box-Muller."""
    prime = hashed_draws.PRIME

    def mix(x):
        for a in hashed_draws._ROUNDS:
            x = (x * a + 12345) % prime
            x = (x ^ (x >> 15)) % prime
        return x

    bits = X.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rows = mix((((bits % prime) * mix(torch.arange(1, X.shape[1] + 1))) % prime).sum(-1) % prime)
    rows = mix((rows + key) % prime)
    u = (mix((rows.unsqueeze(-1) + mix(torch.arange(2 * size))) % prime).to(F64) + 0.5) / prime
    return (-2.0 * u[:, :size].log()).sqrt() * torch.cos(2.0 * math.pi * u[:, size:])


@pytest.mark.parametrize("block", [1, 1_200, None])
def test_a_rows_draws_are_their_definition_in_any_blocks(monkeypatch, block):
    """On a CPU the draws are made in blocks of columns (NOISE_BLOCK numbers, at least 256 columns): in blocks of 256
    columns and a short last one, of 400 columns and a short last one, or in one block, they are the numbers of the
    definition to the bit; no columns, none."""
    X = torch.randn(3, 7, generator=torch.Generator().manual_seed(5), dtype=F64)
    if block is not None:
        monkeypatch.setattr(hashed_draws, "NOISE_BLOCK", block)
    torch.testing.assert_close(row_noise(X, 11, 1_000), _row_noise_by_definition(X, 11, 1_000), rtol=0, atol=0)
    assert row_noise(X, 11, 0).shape == (3, 0)


# --- through the estimator ----------------------------------------------------------------------------------------
def test_a_two_layer_classifier_learns_where_the_square_is_and_saves(tmp_path):
    X, labels = square_images(60)
    clf = GPClassifier(method="deep-conv-hvgp", image_shape=(8, 8), filter_sizes=(3, 3), strides=(1, 1),
                       hidden_channels=2, hidden_inducing=8, n_inducing=8, max_steps=60, batch_size=32, lr=0.05,
                       dtype="float64", progress=False).fit(X, labels)  # float64: the mixture is checked to 1e-12
    assert clf.model_.likelihood.n_latent == 3 and len(clf.model_.hidden) == 1
    assert (clf.predict(X) == labels).mean() >= 0.85
    # the predictive averages the robust-max probabilities over the predict_samples draws of the hidden layer
    means, variances = clf.model_.predict_mixture(torch.tensor((X - clf.x_mean_) / clf.x_std_))
    assert means.shape == (5, 60, 3)
    p = clf.predict_proba(X)
    expected = torch.stack([clf.model_.likelihood.probability(m, v) for m, v in zip(means, variances)]).mean(0)
    np.testing.assert_allclose(p, expected.numpy(), rtol=1e-12)
    clf.save(tmp_path / "deep.gps")
    np.testing.assert_array_equal(gpscale.load(tmp_path / "deep.gps").predict_proba(X), p)
    with pytest.raises(NotImplementedError, match="mixture for its latent predictive, not a joint Gaussian"):
        clf.model_.predict_cov(torch.tensor(X[:3]))


@pytest.mark.parametrize("options, message", [
    ({"n_layers": 0}, r"n_layers \(the number of layers"),
    ({"n_layers": 4, "filter_sizes": None}, "n_layers=4 pass filter_sizes and strides"),
    ({"filter_sizes": (3, 3, 3)}, r"filter_sizes=\(3, 3, 3\) has 3 entries for n_layers=2"),
    ({"strides": 2}, "strides must be a sequence of 2"),
    ({"hidden_channels": 0}, "hidden_channels must be an integer >= 1"),
    ({"hidden_channels": (2, 2)}, r"hidden_channels=\(2, 2\) has 2 entries"),
    ({"filter_sizes": (3, 7)}, "layer 1 .*filter_sizes\\[1\\]=7.* 6 x 6 x 10 input.*pass smaller filter sizes"),
    ({"filter_sizes": (3, 1)}, r"splits a patch's pixels in two.*pass a larger filter_sizes\[-1\]"),
    ({"group": "rotation"}, "group must be one of .* or None"),
    ({"padding": "full"}, "padding must be one of"),
    ({"predict_samples": 0}, r"predict_samples \(the number of draws"),
    ({"hidden_q_scale": 0.0}, r"hidden_q_scale \(.*\) must be a number > 0"),
    ({"kernel": gpscale.kernels.RBF(9)}, "kernel must be a kernel's name"),
    ({"whiten": False}, "q is whitened in every layer"),
])
def test_bad_options_are_refused_with_the_option_and_a_remedy(options, message):
    with pytest.raises(ValueError, match=message):
        DEEP(64, **{"image_shape": (8, 8), "filter_sizes": (3, 3), "strides": (1, 1), **options})
