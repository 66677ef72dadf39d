"""Hard Concrete gates against their distribution."""

import math

import pytest
import torch
from conftest import random_batch

from headcount.models.gates import HardConcreteGates, attach_gates, l0_penalty


@pytest.mark.parametrize("log_alpha", [-2.0, 0.0, 0.7, 3.0])
def test_sampled_gates_match_the_closed_form_probabilities(log_alpha):
    torch.manual_seed(0)
    gates = HardConcreteGates(1, init=log_alpha)
    n = 200_000
    with torch.no_grad():
        gates.log_alpha.data = torch.full((n,), log_alpha)  # n independent heads: one draw each
        samples = gates.sample()
    p_zero, p_one = float((samples == 0).float().mean()), float((samples == 1).float().mean())
    expected_open = float(gates.p_open()[0].detach())
    expected_one = float(gates.p_one()[0].detach())
    tolerance = 4 * math.sqrt(0.25 / n)  # four standard errors of a proportion
    assert p_zero == pytest.approx(1 - expected_open, abs=tolerance)
    assert p_one == pytest.approx(expected_one, abs=tolerance)
    assert ((samples >= 0) & (samples <= 1)).all()


def test_p_open_by_brute_force_integration():
    # P(g > 0) = P(u > sigmoid(beta * log(-l / r) - log alpha)), from s * (r - l) + l > 0.
    gates = HardConcreteGates(3, init=0.0)
    gates.log_alpha.data = torch.tensor([-1.0, 0.3, 2.0])
    u = torch.linspace(1e-6, 1 - 1e-6, 2_000_001)[:, None]
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + gates.log_alpha) / gates.beta)
    open_share = ((s * (gates.high - gates.low) + gates.low) > 0).double().mean(0)
    torch.testing.assert_close(open_share, gates.p_open().double(), atol=1e-5, rtol=0)


def test_evaluation_gate_formula_and_gradients():
    gates = HardConcreteGates(4, init=0.0)
    gates.log_alpha.data = torch.tensor([-5.0, 0.0, 0.5, 5.0])
    gates.eval()
    expected = [max(0.0, min(1.0, 1 / (1 + math.exp(-a)) * 1.2 - 0.1)) for a in (-5.0, 0.0, 0.5, 5.0)]
    assert gates().tolist() == pytest.approx(expected)
    assert gates()[0] == 0 and gates()[3] == 1
    gates.train()
    torch.manual_seed(1)
    (gates() * torch.arange(1.0, 5.0)).sum().backward()
    assert gates.log_alpha.grad is not None and gates.log_alpha.grad.abs().sum() > 0
    gates.log_alpha.grad = None
    l0_penalty([gates]).backward()
    assert (gates.log_alpha.grad > 0).all()  # opening any gate raises the expected count


def test_initialisation_range_and_l0_scaling():
    torch.manual_seed(0)
    gates = HardConcreteGates(10_000)
    assert gates.log_alpha.min() >= -0.61 and gates.log_alpha.max() <= 0.61
    a, b = HardConcreteGates(8, init=1.0), HardConcreteGates(8, init=-1.0)
    mean = l0_penalty([a, b])
    assert float(mean.detach()) == pytest.approx(float((a.p_open().sum() + b.p_open().sum()).detach()) / 2)


def test_gated_model_samples_once_per_batch_and_keeps_fixed_masks(tiny_model):
    gates = attach_gates(tiny_model, types=("enc_self",), init=0.0)
    assert len(gates) == 2
    tiny_model.encoder_layers[0].self_attn.head_mask[1] = 0
    calls = []
    handle = gates[0].register_forward_hook(lambda m, i, o: calls.append(o.detach().clone()))
    tiny_model.train()
    src, tgt = random_batch(tiny_model)
    tiny_model(src, tgt)
    handle.remove()
    assert len(calls) == 1 and calls[0].shape == (4,)  # one sample per head for the whole batch
    tiny_model.eval()
    gates_now = tiny_model.encoder_layers[0].self_attn.gates()
    assert gates_now[1] == 0  # the fixed mask still applies


def test_pinned_open_gates_are_exactly_one_and_untrainable():
    """The lambda = 0 control's gates: every sample is 1, even at the extreme noise values the
    sampler's clamp allows, and neither a loss nor a penalty can move them."""
    from headcount.models.gates import pin_open

    torch.manual_seed(0)
    gates = HardConcreteGates(4096)
    pin_open([gates])
    assert not gates.log_alpha.requires_grad
    assert torch.equal(gates.sample(), torch.ones(4096))
    with torch.no_grad():  # the noise extremes: u at the clamp's ends
        for u in (1e-6, 1 - 1e-6):
            s = torch.sigmoid((math.log(u) - math.log1p(-u) + gates.log_alpha) / gates.beta)
            assert torch.equal((s * (gates.high - gates.low) + gates.low).clamp(0, 1), torch.ones(4096))
    assert torch.equal(gates.deterministic(), torch.ones(4096)) and torch.equal(gates.p_open(), torch.ones(4096))
