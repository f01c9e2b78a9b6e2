"""Your own steps inside the loader: torchvision augmentations on decoded images, and a
chat-template-and-mask step on token rows, run on the loader's transform threads (or worker
processes) instead of the training loop.

    shardfeed shard photos/ -o img          # an ImageFolder: class folders of JPEGs
    shardfeed generate tokens --rows 20000 -o raw-tok && shardfeed shard raw-tok -o tok
    python3 python/examples/transforms.py --images img --tokens tok --steps 50

Each function takes the batch (a dict of numpy arrays) and a `numpy.random.Generator` seeded
for that batch, and returns a dict of numpy arrays: draw every random choice from `rng`, and
the batches are the same for any number of threads or processes and after a resume.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import shardfeed

# Token ids of the chat template (a real tokenizer's special tokens in practice).
USER, ASSISTANT, END = 1, 2, 3
IGNORE = -100


def augment_images(batch: dict, rng: np.random.Generator) -> dict:
    """torchvision's functional v2 transforms, with their random parameters drawn from `rng`:
    a horizontal flip, brightness and contrast jitter, then the normalised float tensor."""
    import torch
    from torchvision.transforms.v2 import functional as F

    images = torch.from_numpy(batch["bytes"]).permute(0, 3, 1, 2)  # [n, 3, H, W] uint8, a view
    out = torch.empty(images.shape, dtype=torch.float32)
    for i, image in enumerate(images):
        if rng.random() < 0.5:
            image = F.horizontal_flip(image)
        image = F.adjust_brightness(image, float(rng.uniform(0.6, 1.4)))
        image = F.adjust_contrast(image, float(rng.uniform(0.6, 1.4)))
        out[i] = F.normalize(image.float() / 255, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    return {"image": out.numpy(), "label": batch["label_index"]}


def chat_and_mask(batch: dict, rng: np.random.Generator, length: int = 256) -> dict:
    """Each row's ids as an assistant answer to a prompt (the row's first quarter, at most 32
    ids): the chat
    template's role tokens around them, labels only on the answer (the prompt masked with
    -100), and 15% of the answer's tokens replaced by a random id (an MLM-style mask)."""
    ids, offsets = batch["input_ids"], batch["input_ids.offsets"]
    n = len(offsets) - 1
    input_ids = np.zeros((n, length), dtype=np.int64)
    labels = np.full((n, length), IGNORE, dtype=np.int64)
    attention = np.zeros((n, length), dtype=np.int8)
    for i in range(n):
        row = ids[offsets[i] : offsets[i + 1]]
        cut = min(len(row) // 4, 32)
        prompt, answer = row[:cut], row[cut:].astype(np.int64)
        masked = answer.copy()
        hit = rng.random(len(answer)) < 0.15
        masked[hit] = rng.integers(4, 32000, int(hit.sum()))
        seq = np.concatenate([[USER], prompt, [ASSISTANT], masked, [END]])[:length]
        target = np.concatenate([np.full(cut + 2, IGNORE), answer, [END]])[:length]
        input_ids[i, : len(seq)] = seq
        labels[i, : len(target)] = target
        attention[i, : len(seq)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}


def run(dataset: str, fn, steps: int, **options) -> tuple[int, float, dict]:
    """`steps` batches of `dataset` through `fn`: rows, seconds, the last batch."""
    loader = shardfeed.Loader(dataset, **options, transform=fn)
    started, rows, batch = time.perf_counter(), 0, {}
    for step, batch in zip(range(steps), loader):
        rows += len(next(iter(batch.values())))
    seconds = time.perf_counter() - started
    loader.close()
    return rows, seconds, batch


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", help="a sharded ImageFolder (columns bytes, label_index)")
    p.add_argument("--tokens", help="a sharded token dataset (an `input_ids` list column)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    out = {}
    if args.images:
        rows, seconds, batch = run(args.images, augment_images, args.steps, batch_size=32,
                                   columns=["bytes", "label_index"], decode_images="bytes", image_size=96,
                                   transform_threads=args.threads)
        print(f"images: {rows / seconds:,.0f} rows/s, image {batch['image'].shape} {batch['image'].dtype}")
        out["images"] = batch
    if args.tokens:
        rows, seconds, batch = run(args.tokens, chat_and_mask, args.steps, batch_size=32,
                                   columns=["input_ids"], transform_processes=args.threads)
        print(f"tokens: {rows / seconds:,.0f} rows/s, input_ids {batch['input_ids'].shape}")
        out["tokens"] = batch
    return out


if __name__ == "__main__":
    main()
