"""Shared test set-up: one inductor cache for every test that compiles, logs in temp dirs."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Every test (and notebook) that compiles shares one cache: a cold compile costs ~20 s here, warm ~2 s.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".inductor-cache"))


import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import Dataset, TensorDataset  # noqa: E402


class TinyNet(torch.nn.Module):
    """Two residual blocks in a ModuleList (so `blocks` finds 'blocks.0', 'blocks.1')."""

    def __init__(self, d: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, d)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)) for _ in range(2)
        )
        self.head = torch.nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)


class SquareDataset(Dataset):
    """Map-style dataset computing its samples in __getitem__ (picklable for workers)."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def tiny_data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g))


@pytest.fixture
def make_bench(tmp_path):
    """Factory for a fast Workbench (3 measured steps) on TinyNet, logging under tmp_path."""
    import workbench as wb

    def make(model=None, data=None, **kw):
        kw.setdefault("loss_fn", torch.nn.CrossEntropyLoss())
        kw.setdefault("optimizer", lambda p: torch.optim.SGD(p, lr=0.05))
        kw.setdefault("steps", 3)
        kw.setdefault("warmup_steps", 1)
        kw.setdefault("log", tmp_path / "runs")
        kw.setdefault("knobs", wb.Knobs(batch_size=8))
        return wb.Workbench(model if model is not None else TinyNet(), data if data is not None else tiny_data(), **kw)

    return make


@pytest.fixture
def fake_clock(monkeypatch):
    """time.perf_counter reads a fake bench's `clock` (its trials advance it), so budget_s is tested
    without real time: `bench = fake_clock(FakeBench(...))`."""
    import time

    holder = {}

    def use(bench):
        holder["bench"] = bench
        return bench

    monkeypatch.setattr(time, "perf_counter", lambda: holder["bench"].clock if holder else 0.0)
    return use


@pytest.fixture(autouse=True)
def _cpu_unless_about_the_device(request, monkeypatch):
    """Tests run on the CPU on a machine with a GPU too: device="auto" means the CPU here (WORKBENCH_DEVICE,
    workload.resolve_device; subprocesses a test starts inherit it). A test about the device paths opts out
    with `@pytest.mark.any_device` (and skips without CUDA, saying why). Notebooks keep "auto": nbval starts
    their kernels before this fixture, and the browser test's JupyterLab is a module fixture set up before it."""
    if request.node.get_closest_marker("any_device") is None:
        monkeypatch.setenv("WORKBENCH_DEVICE", "cpu")
    else:
        monkeypatch.delenv("WORKBENCH_DEVICE", raising=False)


@pytest.fixture(autouse=True)
def _trials_in_kernel_unless_about_the_worker(request, monkeypatch):
    """Unit tests run their trials in the test's own process (WORKBENCH_TRIALS=kernel): they patch the
    workbench's internals and read what the step did. A test about the worker process, the README's
    blocks and every notebook keep the default (`@pytest.mark.worker`; nbval's kernels start before this
    fixture), so the default path is tested where users meet it."""
    if request.node.get_closest_marker("worker") is None:
        monkeypatch.setenv("WORKBENCH_TRIALS", "kernel")
        yield
        return
    monkeypatch.delenv("WORKBENCH_TRIALS", raising=False)
    yield
    from workbench.launch.local import close_all

    close_all()  # no worker process outlives its test (later tests count this process's children)


@pytest.fixture(autouse=True)
def _fixed_warmup(request, monkeypatch):
    """`@pytest.mark.fixed_warmup`: exactly `warmup_steps` warm-up steps (steady.py's old count), for
    tests that count steps or compare losses across trials (a steady warm-up may take more steps
    in one trial than in another, and every warm-up step trains)."""
    if request.node.get_closest_marker("fixed_warmup") is not None:
        monkeypatch.setenv("WORKBENCH_FIXED_WARMUP", "1")


@pytest.hookimpl(trylast=True)  # after `-m`/`-k` deselection: only what will really run counts
def pytest_collection_modifyitems(config, items):
    """When the browser test runs the notebooks (Chromium present, test selected), skip nbval's
    second run of the same notebooks: a cell that raises shows a traceback in the browser and stops
    Run All, which that test fails on, so nbval would only repeat the work (~10 CPU-minutes here)."""
    covered = {_notebook_of(i) for i in items} - {None}
    if not covered:
        return
    dropped = [i for i in items if str(getattr(i, "path", "")).endswith(".ipynb") and Path(i.path).name in covered]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in dropped]


def _chromium_here(item) -> bool:
    return item.get_closest_marker("browser") is not None and Path("/usr/bin/chromium").exists()


def _notebook_of(item) -> str | None:
    """The notebook a browser test item runs (its `name` parameter, or the quickstart's)."""
    if not _chromium_here(item):
        return None
    spec = getattr(item, "callspec", None)
    if spec is not None and "name" in spec.params:
        return spec.params["name"]
    return "01_quickstart.ipynb" if "quickstart" in item.name else None


SLEEP_S = 0.0015  # SleepData: seconds per sample; 2 workers deliver at most 2 / SLEEP_S = 1,333 samples/s


class SleepData(Dataset):
    """A data-bound map-style dataset: each sample waits SLEEP_S (a sleep, like a small file on a
    network disk), so `num_workers` workers deliver at most num_workers / SLEEP_S samples/s, a
    truth that holds however busy the CPU is (sleeping takes no CPU)."""

    def __init__(self, n: int = 4096, sleep_s: float = SLEEP_S) -> None:
        g = torch.Generator().manual_seed(2)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        import time

        time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


def workers_limit(num_workers: int, sleep_s: float = SLEEP_S) -> float:
    """Samples/s that `num_workers` SleepData workers can deliver at most."""
    return num_workers / sleep_s


class SleepNet(torch.nn.Module):
    """A forward that sleeps `sleep_s` (default 20 ms): step times set by the clock, not by the
    shared, loaded CPU (sleeping takes no CPU), for timing truths (early stop, budgets)."""

    def __init__(self, sleep_s: float = 0.02) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.sleep_s = sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(self.sleep_s)
        return self.lin(x)
