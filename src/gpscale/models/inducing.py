"""Initial inducing locations."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["kmeans_centers"]


def kmeans_centers(X: Tensor, m: int, seed: int = 0) -> Tensor:
    """``m`` k-means centres [m, d] of the rows of X [n, d] (scikit-learn's MiniBatchKMeans, seeded).

    With ``m >= n`` the data points themselves are the centres. k-means runs on at most 100,000 rows
    sampled with the same seed, which is plenty to place m centres and keeps the cost bounded.
    """
    from sklearn.cluster import MiniBatchKMeans

    n = X.shape[0]
    if m >= n:
        return X.clone()
    Xnp = X.detach().cpu().numpy().astype(np.float64)
    rng = np.random.default_rng(seed)
    if n > 100_000:
        Xnp = Xnp[rng.choice(n, 100_000, replace=False)]
    km = MiniBatchKMeans(n_clusters=m, random_state=seed, batch_size=max(1024, 3 * m), n_init=1,
                         max_iter=100)
    km.fit(Xnp)
    return torch.as_tensor(km.cluster_centers_, dtype=X.dtype, device=X.device)
