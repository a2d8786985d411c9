"""A method's knowledge is declared on its model class and read through the registry: no module outside the models
names a method by its key, and a registered user model is treated as a built-in one."""
import numpy as np
import pytest
import torch

from gpscale import GPRegressor
from gpscale.defaults import CONVERGENCE, Convergence, TrainingDefaults
from gpscale.describe import method_defaults
from gpscale.models import available_methods, get_model_class
from gpscale.models.base import option_names, register, unregister
from gpscale.models.variational import SVGP
from gpscale.train import fit
from tools.house_metrics import PACKAGE, key_literals, may_name_methods

def test_no_module_outside_the_models_names_a_method_by_its_key():
    keys = set(available_methods())
    found = {rel: lines for path in sorted(PACKAGE.rglob("*.py"))
             if not may_name_methods(rel := path.relative_to(PACKAGE).as_posix())
             and (lines := key_literals(path.read_text(), keys))}
    assert not found, f"method keys named outside the models (declare it on the model class instead): {found}"


def test_the_check_sees_a_key_in_code_and_not_in_a_docstring():
    source = '"""The sgpr method."""\ndef f(method):\n    """Like svgp."""\n    return method == "sgpr"\n'
    assert key_literals(source, {"sgpr", "svgp"}) == [4]


@pytest.mark.parametrize("key", available_methods())
def test_the_class_says_whether_a_named_kernel_starts_at_the_median_as_its_instances_do(key):
    cls = get_model_class(key)
    n_features, images = (64, {"image_shape": (8, 8)}) if "image_shape" in option_names(cls) else (4, {})
    assert cls(n_features, **images).start_lengthscale_at_median() == cls.lengthscale_starts_at_median


OWN = TrainingDefaults("adam", lr=0.037, batch_size=13, max_steps=9)


class UsersModel(SVGP):
    """A user's model: svgp with its own training defaults and float64 under dtype='auto' (svgp's is float32)."""

    default_training = OWN
    auto_dtype = "float64"


@pytest.fixture
def users_model():
    register("users-model")(UsersModel)
    try:
        yield UsersModel
    finally:
        unregister("users-model")
    assert "users-model" not in available_methods()


def test_a_registered_user_model_trains_with_the_defaults_its_class_declares(users_model):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=60)
    reg = GPRegressor(method="users-model", n_inducing=8, progress=False).fit(X, y)
    settings = reg.fit_result_.settings
    assert (settings.optimizer, settings.lr, settings.batch_size, settings.max_steps) == ("adam", 0.037, 13, 9)
    assert reg.training_["max_steps"] == 9
    assert reg.dtype_ == torch.float64 and get_model_class("svgp").auto_dtype == "float32"
    # the trainer, called directly, reads the same row
    model = users_model(2, n_inducing=8).double()
    result = fit(model, torch.as_tensor(X), torch.as_tensor(y), progress=False)
    assert (result.settings.lr, result.settings.batch_size, result.settings.max_steps) == (0.037, 13, 9)
    rows = {row.name: row.default for row in method_defaults("users-model")}
    assert rows["lr"] == "`0.037`" and rows["max_steps"] == "`9`" and "float64" in rows["dtype"]


class ImpatientModel(SVGP):
    """A user's model whose plateau rule stops at the first window that does not improve by more than 1e9."""

    default_convergence = Convergence(tol=1e9, minibatch_tol=1e9, patience=1, lr_cuts=0, minibatch_window=1)


def test_a_model_trains_to_convergence_by_the_plateau_rule_its_class_declares():
    rng = np.random.default_rng(1)
    X = torch.as_tensor(rng.normal(size=(60, 2)))
    y = torch.sin(X[:, 0]) + 0.1 * torch.as_tensor(rng.normal(size=60))
    settings = dict(batch_size=20, max_steps=300, lr=0.01, progress=False)
    impatient = fit(ImpatientModel(2, n_inducing=8).double(), X, y, **settings)
    assert impatient.converged and impatient.steps == 6  # two windows of one epoch (3 steps) each
    assert fit(SVGP(2, n_inducing=8).double(), X, y, **settings).steps > 6
    # an explicit rule still wins over the class's
    assert fit(ImpatientModel(2, n_inducing=8).double(), X, y, convergence=CONVERGENCE, **settings).steps > 6
