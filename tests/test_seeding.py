"""One seeding scheme (``fedsim/seeding.py``): every random stream a client, a task or a protocol
draws is declared once, and its seeds never collide with another stream's; no code computes a
seed by arithmetic (``seed * 1000 + round * 10 + partition`` gave client 10 of round 1 the
seed of client 0 in round 2)."""

import ast
import importlib
import itertools
import pkgutil
from pathlib import Path

import pytest

from fedsim import seeding

ROOT = Path(__file__).parents[1]
PACKAGES = ["fedsim", "fedsim_clients", "fedsim_tasks", "fedsim_strategies", "fedsim_experiments"]
KEYS = {  # what a declared key takes in a run: 3 rounds (and round 0, discovery), 50 clients
    "round": range(4),
    "partition": range(50),
    "dataset": ["persona_chat", "cmu_dog", "wizard_of_wikipedia"],
    "message_type": ["train", "evaluate", "query"],
    "document": ["3M_2018_10K", "BOEING_2022_10K", "PEPSICO_2023_8K"],
    "n": [1, 2, 4, 8],
    "frequency": ["freq", "rare"],
}


def _modules():
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if not info.name.rsplit(".", 1)[-1].startswith(("test_", "conftest")):
                yield info.name


@pytest.fixture(scope="module")
def streams() -> dict[str, seeding.Stream]:
    """Every stream of the platform: each module that draws one declares it at import."""
    for name in _modules():
        importlib.import_module(name)
    return dict(seeding.STREAMS)


def test_every_stream_of_3_rounds_and_50_clients_has_seeds_of_its_own(streams):
    assert {
        "retriever-training",
        "preference-training",
        "generator-training",
        "trust-evaluator-training",
        "process",
        "server-sampling",
        "dialogue-client-split",
        "preference-holdout",
    } <= set(streams)
    owner: dict[int, tuple] = {}
    for s in streams.values():
        assert set(s.keys) <= set(KEYS), f"stream {s.purpose}: give its keys {s.keys} a range here"
        for values in itertools.product(*(KEYS[k] for k in s.keys)):
            draw = (s.purpose, *values)
            seed = s.seed(0, **dict(zip(s.keys, values)))
            assert seed not in owner, f"{draw} draws the seed of {owner[seed]}"
            assert 0 <= seed < 2**s.bits
            owner[seed] = draw
    assert len(owner) > 3000


def test_a_draw_names_exactly_the_keys_of_its_stream(streams):
    training = streams["retriever-training"]
    with pytest.raises(TypeError, match="round"):
        training.seed(0, partition=3)  # the round forgotten: every round would shuffle alike
    with pytest.raises(ValueError, match="declared twice"):
        seeding.stream("retriever-training", "round")
    assert training.seed(0, round=1, partition=10) != training.seed(0, round=2, partition=0)
    assert training.seed(0, round=1, partition=2) == training.seed(0, partition=2, round=1)


ARITHMETIC = (
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Pow,
    ast.LShift,
    ast.RShift,
    ast.BitXor,
)


def _mentions_a_seed(node: ast.AST) -> bool:
    """``node`` is a seed: a variable or attribute ``seed``, ``split_seed``, ``SEED``, or a key
    ``"seed"`` / ``"split_seed"`` (``task["seed"]``), also inside ``int(...)``; what another
    call returns (a stream's draw) is not."""

    def seedlike(name: str) -> bool:
        return name.lower() == "seed" or name.lower().endswith("_seed")

    if isinstance(node, ast.Call):
        return (
            isinstance(node.func, ast.Name)
            and node.func.id in ("int", "float")
            and any(_mentions_a_seed(a) for a in node.args)
        )
    if (
        isinstance(node, ast.Name)
        and seedlike(node.id)
        or isinstance(node, ast.Attribute)
        and seedlike(node.attr)
    ):
        return True
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and seedlike(node.value):
        return True
    return any(_mentions_a_seed(child) for child in ast.iter_child_nodes(node))


def test_no_code_computes_a_seed_by_arithmetic():
    """Everywhere but the derivation itself (``fedsim/seeding.py``)."""
    sources = [
        p
        for package in [*PACKAGES, "bench"]
        for p in (ROOT / package).rglob("*.py")
        if not p.name.startswith(("test_", "conftest")) and p != ROOT / "fedsim" / "seeding.py"
    ]
    found = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            operands = (
                [node.left, node.right]
                if isinstance(node, ast.BinOp) and isinstance(node.op, ARITHMETIC)
                else [node.target, node.value]
                if isinstance(node, ast.AugAssign) and isinstance(node.op, ARITHMETIC)
                else []
            )
            if any(_mentions_a_seed(o) for o in operands):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "seeds come from fedsim.seeding streams, not arithmetic:\n" + "\n".join(found)


def test_reseed_gives_torch_the_state_torch_manual_seed_gives():
    """Without an accelerator reseed seeds torch's CPU generator alone (torch.manual_seed also
    queues a seed for CUDA, formatting the stack each call: 5 ms of every client's message)."""
    torch = pytest.importorskip("torch")
    for seed in (0, 7, 2**62 + 11):
        seeding.reseed(seed)
        ours = (torch.rand(4), torch.randn(2), torch.randint(0, 1000, (3,)))
        torch.manual_seed(seed)
        theirs = (torch.rand(4), torch.randn(2), torch.randint(0, 1000, (3,)))
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b)
