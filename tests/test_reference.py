"""The NumPy reference (scratchlm/reference/numpy_gpt.py) against the torch GPT, brute force and hand
calculations.

Parity runs over every variant combination GPTConfig allows, on tiny models (C=8, H=2, N=2, T=6,
V=11) whose parameters are all perturbed away from their init, so that biases, gammas and betas
of 0 and 1 cannot hide a mistake.
"""

from __future__ import annotations

import ast
import itertools
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scratchlm.model.config import GPTConfig
from scratchlm.model.gpt import GPT
from scratchlm.reference import numpy_gpt as ref

from helpers import VARIANTS, T, V, ids_and_targets, perturbed_model, variant_config, variant_id

REFERENCE_DIR = Path(ref.__file__).resolve().parent

TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see tests/conftest.py


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_logits_and_loss_match_torch(variant, dtype):
    cfg = variant_config(*variant)
    model = perturbed_model(cfg, dtype)
    ids, targets = ids_and_targets()
    with torch.no_grad():
        logits, loss = model(ids, targets)
    params = ref.params_from_state_dict(model.state_dict())
    assert params["transformer.wte.weight"].dtype == (np.float64 if dtype == torch.float64 else np.float32)

    ref_logits = ref.gpt_forward(ids.numpy(), params, cfg)
    assert ref_logits.dtype == params["transformer.wte.weight"].dtype  # dtype follows the params
    diff = np.abs(ref_logits - logits.numpy()).max()
    assert diff <= TOLERANCE[dtype], f"max |logits diff| = {diff:.3g}"
    assert logits.abs().max() > 0.5  # the comparison is not between two near-zero tensors

    ref_loss = ref.cross_entropy(ref_logits, targets.numpy())
    # model.py takes the loss in float32 (even under bf16 autocast), and in float64 for a float64 model
    assert abs(float(ref_loss) - loss.item()) <= max(TOLERANCE[dtype], 1e-6) * max(1.0, loss.item())
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    # and the cross-entropy itself at the dtype's precision, on the same logits
    torch_ce = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)
    assert abs(float(ref.cross_entropy(logits.numpy(), targets.numpy())) - torch_ce.item()) <= TOLERANCE[dtype]


@pytest.mark.parametrize(
    "biases",
    [
        dict(qkv_bias=True, proj_bias=False, mlp_bias=True, lm_head_bias=False),
        dict(qkv_bias=False, proj_bias=True, mlp_bias=False, lm_head_bias=True),
    ],
)
@pytest.mark.parametrize("variant", [("rope", "rmsnorm", "swiglu", "post", True), ("learned", "layernorm", "gelu_tanh", "pre", True),
                                     ("sinusoidal", "layernorm", "gelu", "pre", False)], ids=str)
def test_mixed_bias_switches(variant, biases):
    pos, norm, act, where, tie = variant
    cfg = GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=8, pos_embedding=pos, norm=norm,
                    activation=act, norm_position=where, tie_weights=tie, n_inner=12, **biases)
    model = perturbed_model(cfg, torch.float64, seed=3)
    ids, _ = ids_and_targets()
    with torch.no_grad():
        logits, _ = model(ids)
    params = ref.params_from_state_dict(model.state_dict())
    assert np.abs(ref.gpt_forward(ids.numpy(), params, cfg) - logits.numpy()).max() <= 1e-10


@pytest.mark.parametrize("variant", [("learned", "layernorm", "relu", "pre"), ("rope", "rmsnorm", "swiglu", "post"),
                                     ("sinusoidal", "layernorm", "gelu", "post"), ("none", "rmsnorm", "gelu_tanh", "pre")], ids=str)
def test_padded_batch_matches_torch_and_unpadded_rows(variant):
    cfg = variant_config(*variant)
    model = perturbed_model(cfg, torch.float64, seed=5)
    ids, _ = ids_and_targets(seed=7)
    lengths = [4, 6]
    mask = torch.tensor([[1] * n + [0] * (T - n) for n in lengths])
    with torch.no_grad():
        logits, _ = model(ids, attention_mask=mask)
    params = ref.params_from_state_dict(model.state_dict())
    ref_logits = ref.gpt_forward(ids.numpy(), params, cfg, attention_mask=mask.numpy())
    assert np.abs(ref_logits - logits.numpy()).max() <= 1e-10
    # right padding must not change what the real tokens see: compare with each row on its own
    for row, n in enumerate(lengths):
        alone = ref.gpt_forward(ids[row, :n].numpy(), params, cfg)
        assert np.abs(ref_logits[row, :n] - alone).max() <= 1e-12


@pytest.mark.parametrize("variant", [("learned", "layernorm", "relu", "pre"), ("rope", "rmsnorm", "swiglu", "post")], ids=str)
def test_trace_intermediates_match_torch(variant):
    """The walkthrough prints the trace, so its parts must equal what the torch model computes."""
    cfg = variant_config(*variant)
    model = perturbed_model(cfg, torch.float64, seed=9)
    model.set_attention_impl("explicit")
    ids, _ = ids_and_targets()
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for i, block in enumerate(model.transformer.h):
        hooks.append(block.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"h{i}.out", out)))
        hooks.append(block.attn.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"h{i}.attn_out", out)))
        hooks.append(block.mlp.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"h{i}.mlp_out", out)))
        hooks.append(block.ln_1.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"h{i}.ln_1", out)))
    hooks.append(model.transformer.ln_f.register_forward_hook(lambda m, a, out: seen.__setitem__("ln_f", out)))
    weights: list[torch.Tensor] = []
    with torch.no_grad():
        logits, _ = model(ids, attn_weights=weights)
    for h in hooks:
        h.remove()

    params = ref.params_from_state_dict(model.state_dict())
    trace = ref.forward_trace(ids.numpy(), params, cfg)
    for key, value in seen.items():
        assert np.abs(trace[key] - value.numpy()).max() <= 1e-10, key
    for i, w in enumerate(weights):
        assert np.abs(trace[f"h{i}.weights"] - w.numpy()).max() <= 1e-10
    assert np.abs(trace["logits"] - logits.numpy()).max() <= 1e-10
    np.testing.assert_allclose(trace["probs"].sum(-1), 1.0, atol=1e-12)
    # a single sequence traces to the same numbers as its row of the batch
    single = ref.forward_trace(ids[1].numpy(), params, cfg)
    assert single["h0.q"].shape == (2, T, 4) and single["h0.scores"].shape == (2, T, T)
    assert np.abs(single["logits"] - trace["logits"][1]).max() <= 1e-12


def test_trace_keys_are_documented():
    cfgs = [variant_config("rope", act="swiglu"), variant_config("learned", where="post")]
    keys = set()
    for cfg in cfgs:
        params = ref.params_from_state_dict(perturbed_model(cfg, torch.float32).state_dict())
        keys |= set(ref.forward_trace(np.arange(4), params, cfg, targets=np.arange(1, 5)))
    doc = ref.__doc__
    for key in keys:
        name = key.split(".", 1)[1] if key.startswith("h") and key[1].isdigit() else key
        assert name in doc, f"trace key {key!r} is not described in the module docstring"
    assert {"wte", "pos", "x0", "h0.ln_1", "h0.q", "h0.k", "h0.v", "h0.scores", "h0.mask", "h0.weights",
            "h0.heads", "h0.concat", "h0.attn_out", "h0.resid_1", "h0.ln_2", "h0.mlp_hidden", "h0.mlp_out",
            "h0.out", "ln_f", "logits", "probs", "loss", "h1.out"} <= keys


def test_params_from_plain_arrays_and_dict_config():
    cfg = variant_config("sinusoidal", "rmsnorm", "gelu", "post", True)
    model = perturbed_model(cfg, torch.float32)
    ids, _ = ids_and_targets()
    with torch.no_grad():
        logits, _ = model(ids)
    arrays = {k: v.numpy().copy() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    params = ref.params_from_state_dict(arrays, dtype=np.float64)  # tied: lm_head.weight may be absent
    assert params["transformer.wte.weight"].dtype == np.float64
    out = ref.gpt_forward(ids.numpy(), params, cfg.to_dict())
    assert out.dtype == np.float64
    assert np.abs(out - logits.numpy()).max() <= 1e-4


# ----------------------------------------------------------------------------- no torch in the reference


def test_reference_sources_never_import_torch():
    files = sorted(REFERENCE_DIR.rglob("*.py"))
    assert files
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n == "torch" or n.startswith("torch.") for n in names), f"{path} imports {names}"


def test_reference_runs_in_a_process_without_torch():
    # Loaded by file path: `import scratchlm...` would run scratchlm/__init__.py, which imports torch.
    code = textwrap.dedent(
        f"""
        import importlib.util, sys
        import numpy as np
        spec = importlib.util.spec_from_file_location("numpy_gpt", {str(REFERENCE_DIR / "numpy_gpt.py")!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        rng = np.random.default_rng(0)
        C, Vs, Tn, F = 4, 5, 3, 16
        p = {{"transformer.wte.weight": rng.normal(size=(Vs, C)), "transformer.wpe.weight": rng.normal(size=(Tn, C)),
             "transformer.ln_f.weight": np.ones(C), "transformer.ln_f.bias": np.zeros(C)}}
        for name, shape in [("ln_1.weight", (C,)), ("ln_1.bias", (C,)), ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
                            ("attn.c_attn.weight", (3 * C, C)), ("attn.c_proj.weight", (C, C)),
                            ("mlp.c_fc.weight", (F, C)), ("mlp.c_proj.weight", (C, F))]:
            p["transformer.h.0." + name] = rng.normal(size=shape)
        cfg = dict(vocab_size=Vs, block_size=Tn, n_layer=1, n_head=2, n_embd=C, tie_weights=True)
        trace = mod.forward_trace(np.array([1, 4, 2]), p, cfg)
        assert trace["logits"].shape == (3, 5), trace["logits"].shape
        mod.sample_next(trace["logits"][-1], np.random.default_rng(0), 0.8, 3, 0.9)
        print("torch" in sys.modules)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


# ----------------------------------------------------------------------------- hand calculations


def _hand_params() -> dict[str, np.ndarray]:
    """The `hand` preset (C=2, H=2, V=5, 3 positions, N=1) with numbers chosen to work by hand."""
    eye = np.eye(2)
    return {
        "transformer.wte.weight": np.array([[0.0, 0.0], [1.0, 3.0], [3.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),
        "transformer.wpe.weight": np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 1.0]]),
        "transformer.h.0.ln_1.weight": np.array([2.0, 1.0]),
        "transformer.h.0.ln_1.bias": np.array([0.0, 0.5]),
        "transformer.h.0.attn.c_attn.weight": np.concatenate([eye, eye, eye]),  # q = k = v = ln_1(x)
        "transformer.h.0.attn.c_proj.weight": eye,
        "transformer.h.0.attn.c_proj.bias": np.array([0.0, 0.0]),
        "transformer.h.0.ln_2.weight": np.array([1.0, 1.0]),
        "transformer.h.0.ln_2.bias": np.array([0.0, 0.0]),
        "transformer.h.0.mlp.c_fc.weight": np.zeros((8, 2)),
        "transformer.h.0.mlp.c_fc.bias": np.zeros(8),
        "transformer.h.0.mlp.c_proj.weight": np.zeros((2, 8)),
        "transformer.h.0.mlp.c_proj.bias": np.array([0.5, -0.5]),
        "transformer.ln_f.weight": np.array([1.0, 1.0]),
        "transformer.ln_f.bias": np.array([0.0, 0.0]),
        "lm_head.weight": np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0], [0.0, 0.0]]),
        "lm_head.bias": np.array([0.0, 0.0, 0.0, 0.0, 1.0]),
    }


def test_hand_preset_by_hand():
    cfg = GPTConfig.from_name("hand")
    eps = cfg.norm_eps
    trace = ref.forward_trace(np.array([1, 2, 4]), _hand_params(), cfg)

    # embeddings: wte[1] + wpe[0], wte[2] + wpe[1], wte[4] + wpe[2]
    np.testing.assert_array_equal(trace["x0"], [[1, 3], [3, 0], [1, 2]])
    # LayerNorm of [a, b]: mean (a+b)/2, deviations +-d with d = (a-b)/2, variance d^2
    # -> [d, -d] / sqrt(d^2 + eps); then gamma [2, 1] and beta [0, 0.5]
    n0 = -1 / math.sqrt(1 + eps)  # [1, 3]: d = -1
    n1 = 1.5 / math.sqrt(2.25 + eps)  # [3, 0]: d = 1.5
    n2 = -0.5 / math.sqrt(0.25 + eps)  # [1, 2]: d = -0.5
    ln_1 = np.array([[2 * n0, -n0 + 0.5], [2 * n1, -n1 + 0.5], [2 * n2, -n2 + 0.5]])
    np.testing.assert_allclose(trace["h0.ln_1"], ln_1, rtol=0, atol=1e-14)

    # head size 1: head 0 is column 0, head 1 column 1, and the scale 1/sqrt(1) is 1
    a = ln_1[:, 0]  # q = k = v for head 0, about [-2, 2, -2]
    np.testing.assert_allclose(trace["h0.q"][0, :, 0], a, atol=1e-14)
    np.testing.assert_allclose(trace["h0.scores"][0], np.outer(a, a), atol=1e-13)
    np.testing.assert_array_equal(trace["h0.mask"], [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    # softmax of the masked rows: row 0 sees only itself; row 1 is a two-way softmax
    w10 = math.exp(a[1] * a[0]) / (math.exp(a[1] * a[0]) + math.exp(a[1] * a[1]))
    e = [math.exp(a[2] * a[s]) for s in range(3)]
    weights0 = np.array([[1, 0, 0], [w10, 1 - w10, 0], [e[0] / sum(e), e[1] / sum(e), e[2] / sum(e)]])
    np.testing.assert_allclose(trace["h0.weights"][0], weights0, atol=1e-14)
    heads0 = weights0 @ a
    np.testing.assert_allclose(trace["h0.heads"][0, :, 0], heads0, atol=1e-13)
    # c_proj is the identity with zero bias, so the attention output is the two heads side by side
    np.testing.assert_allclose(trace["h0.attn_out"][:, 0], heads0, atol=1e-13)
    np.testing.assert_allclose(trace["h0.resid_1"][:, 0], [1, 3, 1] + heads0, atol=1e-13)
    # the MLP's weights are zero: its output is c_proj's bias at every position
    np.testing.assert_allclose(trace["h0.mlp_out"], [[0.5, -0.5]] * 3, atol=0)


def test_hand_preset_torch_agrees_too():
    cfg = GPTConfig.from_name("hand")
    params = _hand_params()
    model = GPT(cfg).double().eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
    ids = torch.tensor([[1, 2, 4]])
    with torch.no_grad():
        logits, _ = model(ids)
    assert np.abs(ref.gpt_forward(ids.numpy(), params, cfg) - logits.numpy()).max() <= 1e-12


def test_small_pieces_by_hand():
    # cross-entropy of logits [0, ln 3] with target 1: -log(3 / (1 + 3))
    assert math.isclose(ref.cross_entropy(np.array([[0.0, math.log(3)]]), np.array([1])), -math.log(0.75), rel_tol=1e-14)
    # ignored targets are left out of the mean; all ignored gives NaN like torch
    logits = np.array([[0.0, math.log(3)], [5.0, -5.0]])
    assert math.isclose(ref.cross_entropy(logits, np.array([1, -100])), -math.log(0.75), rel_tol=1e-14)
    assert math.isnan(ref.cross_entropy(logits, np.array([-100, -100])))
    # RMSNorm of [3, 4]: mean of squares 12.5
    np.testing.assert_allclose(ref.rms_norm(np.array([3.0, 4.0]), np.array([1.0, 2.0]), 1e-5),
                               [3 / math.sqrt(12.5 + 1e-5), 8 / math.sqrt(12.5 + 1e-5)], atol=1e-15)
    # sinusoidal position 1 with C = 4: angles 1 and 1/100
    np.testing.assert_allclose(ref.sinusoidal_table(2, 4)[1], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)])
    # RoPE with hs = 2 turns the pair (x1, x2) by pos radians
    cos, sin = ref.rope_tables(3, 2, 10000.0)
    turned = ref.apply_rope(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0]]), cos, sin)
    np.testing.assert_allclose(turned, [[1, 0], [math.cos(1), math.sin(1)], [-2 * math.sin(2), 2 * math.cos(2)]], atol=1e-15)
    # GELU at 1: 0.5 * (1 + erf(1/sqrt 2)) = Phi(1) = 0.841344746...
    assert math.isclose(ref.gelu(np.array([1.0]))[0], 0.8413447460685429, rel_tol=1e-15)
    # head split/merge: head h owns columns h*hs:(h+1)*hs
    x = np.arange(12.0).reshape(2, 6)  # (T=2, C=6), H=3, hs=2
    heads = ref.split_heads(x, 3)
    np.testing.assert_array_equal(heads[1], [[2, 3], [8, 9]])
    np.testing.assert_array_equal(ref.merge_heads(heads), x)


# ----------------------------------------------------------------------------- sampling


def _py_softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


ROWS = [np.random.default_rng(s).normal(scale=2.0, size=7) for s in range(12)]


@pytest.mark.parametrize("row", range(len(ROWS)))
def test_top_k_one_is_argmax(row):
    logits = ROWS[row]
    rng = np.random.default_rng(row)
    best = max(range(len(logits)), key=lambda i: logits[i])
    assert all(ref.sample_next(logits, rng, temperature=1.5, top_k=1) == best for _ in range(20))
    assert ref.sample_next(logits, rng, temperature=0) == best


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("row", range(4))
def test_temperature_scales_logits(row, temperature):
    logits = ROWS[row]
    expected = _py_softmax([x / temperature for x in logits])
    np.testing.assert_allclose(ref.next_token_probs(logits, temperature), expected, atol=1e-15)


@pytest.mark.parametrize("k", [1, 2, 3, 6, 7, 50])
@pytest.mark.parametrize("row", range(4))
def test_top_k_keeps_the_k_largest(row, k):
    logits = ROWS[row]
    top = sorted(range(len(logits)), key=lambda i: -logits[i])[:k]
    kept = _py_softmax([logits[i] for i in top])
    expected = [0.0] * len(logits)
    for i, p in zip(top, kept):
        expected[i] = p
    np.testing.assert_allclose(ref.next_token_probs(logits, 1.0, top_k=k), expected, atol=1e-15)


@pytest.mark.parametrize("top_p", [0.01, 0.3, 0.5, 0.8, 0.95, 1.0])
@pytest.mark.parametrize("row", range(len(ROWS)))
def test_top_p_keeps_the_smallest_set_reaching_p(row, top_p):
    logits = ROWS[row]
    n = len(logits)
    probs = _py_softmax(list(logits))
    # brute force over every subset: the smallest size whose mass can reach p, and the best mass at it
    best_size, best_mass = None, -1.0
    for size in range(1, n + 1):
        masses = [sum(probs[i] for i in subset) for subset in itertools.combinations(range(n), size)]
        reaching = [m for m in masses if m >= top_p - 1e-12]
        if reaching:
            best_size, best_mass = size, max(masses)
            break
    out = ref.next_token_probs(logits, 1.0, top_p=top_p)
    kept = np.flatnonzero(out > 0)
    assert len(kept) == best_size >= 1
    assert math.isclose(sum(probs[i] for i in kept), best_mass, rel_tol=1e-12)
    np.testing.assert_allclose(out[kept], np.array(probs)[kept] / best_mass, rtol=1e-12)


def test_top_p_tiny_keeps_one_token_and_combines_with_top_k():
    logits = np.array([0.0, 0.1, 3.0, 2.9, -1.0])
    assert np.flatnonzero(ref.next_token_probs(logits, 1.0, top_p=1e-9)).tolist() == [2]
    # top_k=2 leaves tokens 2 and 3 at about 0.525 / 0.475: top_p=0.6 then needs both
    out = ref.next_token_probs(logits, 1.0, top_k=2, top_p=0.6)
    assert np.flatnonzero(out).tolist() == [2, 3]
    assert np.flatnonzero(ref.next_token_probs(logits, 1.0, top_k=2, top_p=0.5)).tolist() == [2]


def test_top_p_at_exact_boundaries():
    # probabilities 1/2, 1/4, 1/8, 1/8 are exact in binary, so p can be reached exactly
    logits = np.log([0.5, 0.25, 0.125, 0.125])
    for top_p, n_kept in [(0.5, 1), (0.5000001, 2), (0.75, 2), (0.875, 3), (0.9, 4), (1.0, 4)]:
        assert np.count_nonzero(ref.next_token_probs(logits, 1.0, top_p=top_p)) == n_kept, top_p


def test_sampling_frequencies_follow_the_filtered_distribution():
    logits = ROWS[0]
    probs = ref.next_token_probs(logits, 0.8, top_k=4, top_p=0.9)
    rng = np.random.default_rng(123)
    n = 20000
    draws = np.array([ref.sample_next(logits, rng, 0.8, 4, 0.9) for _ in range(n)])
    counts = np.bincount(draws, minlength=len(logits)) / n
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(probs))  # never a filtered-out token
    np.testing.assert_allclose(counts, probs, atol=0.015)  # about 4 standard errors at n = 20000
    # the same seed gives the same draws
    a = [ref.sample_next(logits, np.random.default_rng(7)) for _ in range(3)]
    b = [ref.sample_next(logits, np.random.default_rng(7)) for _ in range(3)]
    assert a == b


@pytest.mark.parametrize("kwargs", [dict(temperature=-1.0), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)])
def test_bad_sampling_arguments_raise(kwargs):
    with pytest.raises(ValueError):
        ref.next_token_probs(ROWS[0], **kwargs)
