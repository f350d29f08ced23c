"""Issue 17, item 5: user models. A model that gives only ``dim``, ``sample_prior``, ``log_prior``
and ``log_likelihood`` runs in the engine (autograd inside its inference mode), and model
plug-ins come from the ``cusp.models`` entry-point group: real distributions on disk, found
by importlib.metadata, usable ones merged, unusable ones refused with the reason.

The example plug-in package (examples/cusp-plugin-example) installed with pip and used through
``cusp replay``, the API with a worker process, and ``cusp.Detector``: tests/test_plugin_install.py."""

import math
import sys
import textwrap
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from models import Model, ModelError, build_model
from models.registry import REGISTRY, broken_plugins, load_plugins, models, parse_spec
from service.detect import DetectorConfig, OfflineRun
from service.sgais import build_sampler


@dataclass(frozen=True)
class MinimalGaussian(Model):
    """N(mu, 1) per row with mu ~ N(0, 1): only the four things a model must give."""

    name: ClassVar[str] = "minimal"

    @property
    def dim(self) -> int:
        return 1

    def sample_prior(self, generator, n):
        return torch.randn((n, 1), generator=generator, dtype=torch.float64)

    def log_prior(self, theta):
        return -0.5 * (math.log(2 * math.pi) + theta[:, 0] ** 2)

    def log_likelihood(self, theta, rows):
        return -0.5 * (math.log(2 * math.pi) + (rows[None, :, 0] - theta[:, None, 0]) ** 2)


def test_autograd_defaults_work_inside_inference_mode():
    m = MinimalGaussian()
    theta = torch.tensor([[0.5], [-1.0]], dtype=torch.float64)
    rows = torch.tensor([[1.0], [2.0], [-0.5]], dtype=torch.float64)
    w = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    expect_lik = ((rows[:, 0] - theta) * w).sum(1, keepdim=True)  # d/dmu of sum_b w_b log N(y_b | mu, 1)
    with torch.inference_mode():
        ti, ri, wi = theta.clone(), rows.clone(), w.clone()
        assert ti.is_inference()
        g_lik, g_prior = m.grad_log_likelihood(ti, ri, wi), m.grad_log_prior(ti)
    torch.testing.assert_close(g_lik, expect_lik, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_prior, -theta, rtol=0, atol=1e-12)
    # and outside inference mode, with inputs that require grad, the inputs are left alone
    t = theta.clone().requires_grad_(True)
    torch.testing.assert_close(m.grad_log_likelihood(t, rows, w), expect_lik, rtol=0, atol=1e-12)
    assert t.grad is None


def test_minimal_model_runs_sgais_with_the_detector():
    g = torch.Generator().manual_seed(1)
    data = torch.cat([torch.randn(400, 1, generator=g, dtype=torch.float64),
                      4 + torch.randn(400, 1, generator=g, dtype=torch.float64)])
    run = OfflineRun(build_sampler(MinimalGaussian()), seed=0, config=DetectorConfig(expected_run_length=400))
    events, results = [], []
    for lo in range(0, 800, 50):
        res, ev = run.step(data[lo : lo + 50])
        results.append(res)
        events += ev
    assert results[-1].n == 800 and math.isfinite(results[-1].log_evidence) and results[0].method == "sgais"
    assert [e.location for e in events] == [400]


# --- plug-ins from the entry-point group --------------------------------------------------------
GOOD = '''
import math
from dataclasses import dataclass
from typing import ClassVar
import torch
from models import Model


@dataclass(frozen=True)
class {cls}(Model):
    name: ClassVar[str] = {name!r}
    width: float = 1.0

    @property
    def dim(self):
        return 1

    def sample_prior(self, generator, n):
        return torch.randn((n, 1), generator=generator, dtype=torch.float64)

    def log_prior(self, theta):
        return -0.5 * theta[:, 0] ** 2

    def log_likelihood(self, theta, rows):
        return -0.5 * ((rows[None, :, 0] - theta[:, None, 0]) / self.width) ** 2
'''


def distribution(site, dist: str, module: str, source: str, entry_points: dict[str, str]) -> None:
    """An installed distribution as pip leaves it: the module and a .dist-info with its entry points."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"  # named as pip names it
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[cusp.models]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))


@pytest.fixture
def site(tmp_path):
    """A directory on sys.path, like site-packages; plug-ins are looked up again before and after."""
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for mod in [m for m in sys.modules if m.startswith("plug_")]:
        del sys.modules[mod]
    load_plugins(refresh=True)


def test_plugins_are_merged_and_bad_ones_refused_with_the_reason(site):
    distribution(site, "plug-good", "plug_good", GOOD.format(cls="Wide", name="wide"), {"wide": "plug_good:Wide"})
    distribution(site, "plug-clash", "plug_clash", GOOD.format(cls="Gmm", name="gmm"), {"gmm": "plug_clash:Gmm"})
    distribution(site, "plug-notmodel", "plug_notmodel", "class Thing:\n    pass\n", {"thing": "plug_notmodel:Thing"})
    distribution(site, "plug-misnamed", "plug_misnamed", GOOD.format(cls="M", name="other"), {"misnamed": "plug_misnamed:M"})
    distribution(site, "plug-broken", "plug_broken", "raise RuntimeError('no licence file')\n", {"broken": "plug_broken:X"})
    distribution(site, "plug-twin-a", "plug_twin_a", GOOD.format(cls="T", name="twin"), {"twin": "plug_twin_a:T"})
    distribution(site, "plug-twin-b", "plug_twin_b", GOOD.format(cls="T", name="twin"), {"twin": "plug_twin_b:T"})
    distribution(site, "plug-badname", "plug_badname", GOOD.format(cls="B", name="Bad_Name"), {"Bad_Name": "plug_badname:B"})
    plugins = load_plugins(refresh=True)
    assert set(plugins) == {"wide"}
    assert set(models()) == set(REGISTRY) | {"wide"} and "wide" not in REGISTRY

    model = build_model("wide:width=2", 1)
    assert model.name == "wide" and model.width == 2.0 and model.spec() == "wide:width=2.0"
    assert parse_spec("wide:width=3") == ("wide", {"width": "3"})
    with pytest.raises(ModelError, match="has no setting 'depth'; its settings: sampler, width"):
        build_model("wide:depth=1", 1)
    assert type(build_model("gmm", 2)).__module__ == "models.mixture"  # the built-in keeps its name

    why = broken_plugins()
    assert set(why) == {"gmm", "thing", "misnamed", "broken", "twin", "Bad_Name"}
    assert "'gmm' is a built-in model's name" in why["gmm"] and "plug-clash 0.1" in why["gmm"]
    assert "is not a subclass of models.base.Model" in why["thing"]
    assert "M.name is 'other'; it must be the entry point's name 'misnamed'" in why["misnamed"]
    assert "cannot be imported: RuntimeError: no licence file" in why["broken"]
    assert "registers 'twin' too" in why["twin"]
    assert "lower-case letters" in why["Bad_Name"]
    for name in ("thing", "misnamed", "broken", "twin"):  # a spec naming one says why it is unusable
        with pytest.raises(ModelError, match=f"plug-in '{name}'"):
            build_model(name, 1)
    with pytest.raises(ModelError, match="unknown model 'nope'; known models: .*wide"):
        build_model("nope", 1)


def test_plugins_are_looked_up_once_until_refreshed(site):
    assert "late" not in load_plugins(refresh=True)
    distribution(site, "plug-late", "plug_late", GOOD.format(cls="Late", name="late"), {"late": "plug_late:Late"})
    assert "late" not in models()  # installed after the lookup: not seen until refreshed
    assert "late" in load_plugins(refresh=True) and build_model("late", 1).name == "late"
