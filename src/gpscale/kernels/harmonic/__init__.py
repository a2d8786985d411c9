"""Group actions and the real harmonic sub-kernels of the Harmonic Kernel Decomposition (HKD; Sun, Shi, Wilson &
Grosse, "Scalable Variational Gaussian Processes via Harmonic Kernel Decomposition", ICML 2021).

A finite abelian group acts on R^d through J commuting cyclic "ways" G_1..G_J with periods P_1..P_J
(``G_j^{P_j} = id``). Its S = prod_j P_j elements are numbered row-major over the multi-index (s_1..s_J),

    G^s = G_1^{s_1} o ... o G_J^{s_J},    s = ravel((s_1..s_J), (P_1..P_J)).

If k is invariant, ``k(G x, G x') = k(x, x')``, the discrete Fourier transform of ``s -> k(x, G^s x')`` splits it
into sub-kernels. Pairing the complex frequencies t and P - t gives the real form used here (the paper's Section 3.4):

    k_t(x, x') = sum_s W[t, s] k(x, G^s x'),    W = W(P_1) ⊗ ... ⊗ W(P_J)  [T, S],
    W(P)[t, s] = (c_t / P) cos(2 pi t s / P),   c_t = 1 if t = 0 or 2t = P else 2,   t = 0..floor(P/2),

so T = prod_j (floor(P_j / 2) + 1). Because ``sum_t W[t, s] = delta_{s0}``, ``sum_t k_t = k`` for any G; only
invariance makes each k_t symmetric and PSD and their RKHSs mutually orthogonal, so that f ~ GP(0, k) is a sum of
independent f_t ~ GP(0, k_t) (the HVGP sub-processes). :func:`check_invariant` tests it on sample points: an ARD
kernel is not invariant to PCA negations, rotations, coordinate shifts or image actions.

The orbit is always applied to the second argument (the inducing points, in HVGP), and every action is made of
differentiable tensor operations, so gradients reach the kernel hyperparameters and X2. Inputs are X [n, d];
images are flattened row-major over [height, width, channels] (channels last). Work in float64: k_t is a signed
sum of similar numbers, and in float32 the cancellation can cost the sub-kernel matrices their positive
semi-definiteness.
"""
from .actions import (CyclicShift, Identity, ImageFlip, ImageRoll, LongitudeRotation, Negation, OrthogonalAction,
                      SubspaceNegation, negation_basis, pca_directions, pca_negations, sphere_embedding,
                      subspace_negations)
from .algebra import (block_harmonic_grams, check_invariant, harmonic_gram, harmonic_kernel, harmonic_kernels,
                      orbit_gram)
from .group import GroupAction, Product, real_weights

__all__ = ["GroupAction", "Identity", "Negation", "SubspaceNegation", "pca_directions", "negation_basis",
           "subspace_negations", "pca_negations", "CyclicShift", "OrthogonalAction", "LongitudeRotation",
           "sphere_embedding", "ImageRoll", "ImageFlip", "Product", "real_weights", "orbit_gram", "harmonic_kernels",
           "harmonic_kernel", "harmonic_gram", "block_harmonic_grams", "check_invariant"]
