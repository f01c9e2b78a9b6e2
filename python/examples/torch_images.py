"""Train an image classifier from a sharded ImageFolder: JPEGs decoded, randomly cropped,
resized and flipped by shardfeed's threads into pinned uint8 batches; the float conversion and
normalisation run on the GPU.

    shardfeed shard images/ -o ds                     # an ImageFolder: class folders of images
    python3 python/examples/torch_images.py ds --steps 200 --image-size 224 --threads 8

Under `torchrun`, each process reads its own rank's rows (rank and world size come from
`torch.distributed`). Checkpoint `loader.state_dict()` with the model: a restarted job
continues with the same batches, crops included.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from shardfeed.torch import IterableDataset

# ImageNet statistics, as torchvision's Normalize uses them.
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


def model(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes),
    )


def train(dataset: str, steps: int, batch_size: int, image_size: int, threads: int | None,
          classes: int = 1000, seed: int = 0) -> tuple[list[float], dict]:
    """Run `steps` steps; returns the losses and the loader's state after them."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ds = IterableDataset(dataset, batch_size, columns=["bytes", "label_index"],
                         decode_images="bytes", image_size=image_size, crop="random_resized",
                         flip=True, channels_first=True, threads=threads, seed=seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=None)   # shardfeed makes the batches
    net = model(classes).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    mean, std = MEAN.to(device), STD.to(device)
    losses: list[float] = []
    epoch = 0
    while len(losses) < steps:
        ds.set_epoch(epoch)
        for batch in loader:
            # uint8 [B, 3, H, W] from a pinned slab: the copy overlaps compute on a GPU.
            x = batch["bytes"].to(device, non_blocking=True).float().sub_(mean).div_(std)
            y = batch["label_index"].to(device, non_blocking=True).long()
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
        epoch += 1
    return losses, ds.state_dict()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--classes", type=int, default=1000)
    args = p.parse_args()
    losses, _ = train(args.dataset, args.steps, args.batch_size, args.image_size, args.threads,
                      args.classes)
    print(f"{len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
