"""PyTorch: a real training loop, resume from state_dict, DataLoader workers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import shardfeed  # noqa: E402
from shardfeed.torch import IterableDataset  # noqa: E402
from conftest import TOKENS_ROWS  # noqa: E402

PAD = 64
BATCH = 64


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32_000, 16)
        self.head = torch.nn.Linear(16 + 8, 1)

    def forward(self, batch):
        tokens, lengths = batch["tokens"], batch["tokens.lengths"]
        mask = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]
        pooled = (self.embed(tokens.long()) * mask[..., None]).sum(1) / lengths[:, None]
        return self.head(torch.cat([pooled, batch["features"]], dim=1)).squeeze(1)


def train(dataset, epochs, stop_after=None, state=None):
    """Train; returns (ids seen, loss per step, state when stopped early)."""
    torch.manual_seed(0)
    model = TinyModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    loader = DataLoader(dataset, batch_size=None)
    if state is not None:
        dataset.load_state_dict(state)
    seen, losses, steps = [], [], 0
    for _ in range(epochs):  # each pass over the DataLoader runs the next epoch
        for batch in loader:
            assert batch["tokens"].dtype == torch.int32 and batch["tokens"].shape == (BATCH, PAD)
            opt.zero_grad()
            loss = loss_fn(model(batch), batch["label"])
            loss.backward()
            opt.step()
            seen.append(batch["id"].tolist())
            losses.append(loss.item())
            steps += 1
            if stop_after is not None and steps == stop_after:
                return seen, losses, dataset.state_dict()
    return seen, losses, None


def dataset(url):
    return IterableDataset(
        url, BATCH, seed=7, pad_to=PAD, columns=["id", "label", "features", "tokens"]
    )


def test_training_loop_two_epochs_and_resume(tokens_dataset):
    full, losses, _ = train(dataset(tokens_dataset), epochs=2)
    per_epoch = TOKENS_ROWS // BATCH
    assert len(full) == 2 * per_epoch
    assert all(l == l for l in losses)  # finite
    for epoch in (full[:per_epoch], full[per_epoch:]):
        assert sorted(sum(epoch, [])) == list(range(TOKENS_ROWS))
    assert full[:per_epoch] != full[per_epoch:]

    # Stop mid-epoch 0, then resume in a fresh dataset object and loader.
    stop = per_epoch // 2 + 3
    head, _, state = train(dataset(tokens_dataset), epochs=2, stop_after=stop)
    assert head == full[:stop]
    resumed = dataset(tokens_dataset)
    resumed.load_state_dict(state)
    tail = []
    for batch in DataLoader(resumed, batch_size=None):
        tail.append(batch["id"].tolist())
    resumed.set_epoch(1)
    for batch in DataLoader(resumed, batch_size=None):
        tail.append(batch["id"].tolist())
    assert head + tail == full


def test_tensors_share_the_slab(tokens_dataset):
    ds = dataset(tokens_dataset)
    batch = next(iter(DataLoader(ds, batch_size=None)))
    raw = next(iter(shardfeed.Loader(tokens_dataset, BATCH, seed=7, pad_to=PAD, columns=["id", "tokens"])))
    assert batch["id"].tolist() == raw["id"].tolist()
    loader = ds.loader()
    assert loader.pinning in ("cuda", "page-aligned")
    if torch.cuda.is_available():  # pinned slabs copy asynchronously
        assert batch["tokens"].is_pinned() == (loader.pinning == "cuda")
        batch["tokens"].to("cuda", non_blocking=True)


def test_dataloader_workers_fork_their_own_loaders(tokens_dataset):
    ds = dataset(tokens_dataset)
    len(ds)  # builds a loader in this process before the workers fork
    seen = []
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    for batch in loader:
        seen.extend(batch["id"].tolist())
    assert sorted(seen) == list(range(TOKENS_ROWS))
