import numpy as np
import pytest
import torch
from sklearn.utils.estimator_checks import parametrize_with_checks

import gpscale
from gpscale import GPClassifier, GPRegressor
from gpscale.distributed import LocalComm
from gpscale.estimator.classifier import global_classes
from gpscale.io import ModelFileError

FAST = dict(n_inducing=16, epochs=40, batch_size=64, lr=0.05, progress=False)


def blobs(n_per_class=60, centres=((-2, 0), (2, 0), (0, 3)), seed=0):
    rng = np.random.default_rng(seed)
    X = np.concatenate([rng.normal(c, 0.6, (n_per_class, 2)) for c in centres])
    return X, np.repeat(np.arange(len(centres)), n_per_class)


# float64: scikit-learn checks that predictions on a subset equal those on the whole to 1e-7; one test per check,
# for parallel workers
@parametrize_with_checks([GPClassifier(method="svgp", n_inducing=8, epochs=15, batch_size=64, lr=0.1, progress=False,
                                       dtype="float64")])
def test_check_estimator(estimator, check):
    check(estimator)


def test_two_classes_use_the_probit_likelihood_and_any_labels():
    X, codes = blobs(centres=((-2, 0), (2, 0)))
    y = np.array(["no", "yes"])[codes]
    clf = GPClassifier(**FAST).fit(X, y)
    assert clf.model_.likelihood.__class__.__name__ == "Bernoulli"
    assert list(clf.classes_) == ["no", "yes"]
    proba = clf.predict_proba(X)
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-12)
    assert clf.score(X, y) > 0.95
    # the columns follow classes_: the "yes" blob (x > 0) gets its probability in column 1
    assert proba[X[:, 0] > 1, 1].mean() > 0.9 and proba[X[:, 0] < -1, 0].mean() > 0.9


@pytest.mark.parametrize("likelihood", [None, "softmax"])
def test_three_classes_use_a_multiclass_likelihood(likelihood):
    X, y = blobs()
    clf = GPClassifier(likelihood=likelihood, **FAST).fit(X, y + 10)  # labels 10, 11, 12
    assert clf.model_.likelihood.__class__.__name__ == ("RobustMax" if likelihood is None else "Softmax")
    assert list(clf.classes_) == [10, 11, 12] and clf.predict_proba(X).shape == (len(y), 3)
    assert clf.score(X, y + 10) > 0.9
    assert set(clf.predict(X)) <= {10, 11, 12}


def test_save_and_load_give_the_same_probabilities(tmp_path):
    X, y = blobs()
    clf = GPClassifier(method="hvgp", group="pca_negation", n_ways=1, **FAST).fit(X, y)
    clf.save(tmp_path / "clf.gps", metadata={"names": ["a", "b"]})
    back = gpscale.load(tmp_path / "clf.gps")
    assert isinstance(back, GPClassifier) and back.metadata_ == {"names": ["a", "b"]}
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))
    np.testing.assert_array_equal(back.classes_, clf.classes_)
    with pytest.raises(ModelFileError, match="holds a 'GPClassifier', not a GPRegressor"):
        GPRegressor.load(tmp_path / "clf.gps")


def test_bad_targets_and_methods_say_what_to_do():
    X, y = blobs()
    with pytest.raises(ValueError, match="one class only"):
        GPClassifier(**FAST).fit(X, np.zeros(len(X)))
    with pytest.raises(ValueError, match="'bernoulli' is for two classes, but y has 3"):
        GPClassifier(likelihood="bernoulli", **FAST).fit(X, y)
    with pytest.raises(ValueError, match="Unknown label type"):
        GPClassifier(**FAST).fit(X, X[:, 0])
    with pytest.raises(ValueError, match="supports the likelihoods"):
        GPClassifier(method="sgpr", **FAST).fit(X, y)
    clf = GPClassifier(**FAST).fit(X, y)
    with pytest.raises(ValueError, match="features"):
        clf.predict(X[:, :1])


def test_the_classes_of_every_process_are_gathered():
    class TwoRanks(LocalComm):
        world_size = 2

        def all_gather(self, tensor):  # the other rank holds the labels 7 and 3
            return torch.cat([tensor, torch.tensor([7.0, 3.0], dtype=tensor.dtype)])

    np.testing.assert_array_equal(global_classes(np.array([3, 1, 1]), TwoRanks()), [1, 3, 7])

    class TwoRanksOfText(LocalComm):
        world_size = 2

        def all_gather(self, tensor):  # the other rank holds the labels "zebra" and "a"
            return torch.cat([tensor, torch.tensor(list(b'["zebra", "a"]\n'), dtype=tensor.dtype)])

    assert global_classes(np.array(["b", "a", "b"]), TwoRanksOfText()).tolist() == ["a", "b", "zebra"]
